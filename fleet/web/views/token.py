"""The API token page: create or rotate the token, shown once, with a curl example."""

from __future__ import annotations

import json
from typing import cast

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from fleet.models import ApiToken
from fleet.services.tokens import token_rotate
from fleet.web.access import member_required

EXAMPLE_JOB = {"name": "hello", "command": "nvidia-smi && echo hello", "gpus": 1, "time_limit": 600}


@member_required
def token_page(request: HttpRequest) -> HttpResponse:
    key = None
    if request.method == "POST":
        key = token_rotate(user=request.user)
    token = ApiToken.objects.filter(user_id=cast(int, request.user.pk)).first()
    url = request.build_absolute_uri("/api/v1/jobs/")
    curl = (
        f"curl -X POST {url} \\\n"
        f"  -H 'Authorization: Token {key or '<your token>'}' \\\n"
        "  -H 'Content-Type: application/json' \\\n"
        f"  -d '{json.dumps(EXAMPLE_JOB)}'"
    )
    return render(request, "web/token.html", {"key": key, "token": token, "curl": curl})
