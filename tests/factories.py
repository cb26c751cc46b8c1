from __future__ import annotations

import factory
from django.contrib.auth import get_user_model

from fleet.models import Gpu, Job, Membership, Node, Team


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.django.Password("pw-for-tests")


class TeamFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Team
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"team{n}")
    name = factory.LazyAttribute(lambda o: o.slug.title())


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    user = factory.SubFactory(UserFactory)
    team = factory.SubFactory(TeamFactory)
    role = "member"
    is_default = True


class NodeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Node

    name = factory.Sequence(lambda n: f"node{n}")


class GpuFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Gpu

    node = factory.SubFactory(NodeFactory)
    index = factory.Sequence(lambda n: n)
    uuid = factory.Sequence(lambda n: f"GPU-test-{n:06d}")
    model = "A100-80GB"
    memory_mb = 81920


class JobFactory(factory.django.DjangoModelFactory):
    """A pending job created directly (tests that exercise submission use the service)."""

    class Meta:
        model = Job

    owner = factory.SubFactory(UserFactory)
    team = factory.SubFactory(TeamFactory)
    name = factory.Sequence(lambda n: f"job{n}")
    command = "echo hello"
    gpus = 1
    time_limit = 3600
