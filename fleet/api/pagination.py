"""Page-number pagination that says what is wrong with a page or page size (400)."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.filters import OrderingFilter
from rest_framework.pagination import PageNumberPagination

from fleet.api.serializers import INT_MAX


def _whole(params: Any, name: str, low: int, high: int) -> int | None:
    raw = params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or not low <= value <= high:
        raise ValidationError({name: [f"Give a whole number from {low} to {high}; got {raw!r}."]})
    return value


class Pagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request: Any) -> int:
        size = _whole(request.query_params, "page_size", 1, self.max_page_size)
        return self.page_size if size is None else size

    def paginate_queryset(self, queryset: Any, request: Any, view: Any = None) -> Any:
        _whole(request.query_params, "page", 1, INT_MAX)
        try:
            return super().paginate_queryset(queryset, request, view)
        except NotFound:
            # Past the last page: nothing there, named like any other bad parameter.
            raise ValidationError({"page": ["There is no such page."]})


class StrictOrderingFilter(OrderingFilter):
    """?ordering= with a field the endpoint cannot sort by is an error, not ignored."""

    def get_ordering(self, request: Any, queryset: Any, view: Any) -> Any:
        params = request.query_params.get(self.ordering_param)
        if params:
            fields = [param.strip() for param in params.split(",")]
            valid = {
                name for name, _ in self.get_valid_fields(queryset, view, {"request": request})
            }
            bad = [f for f in fields if f.lstrip("-") not in valid]
            if bad:
                raise ValidationError(
                    {
                        self.ordering_param: [
                            f"Cannot sort by {', '.join(bad)}; "
                            f"sort by one of: {', '.join(sorted(valid))} (prefix - to reverse)."
                        ]
                    }
                )
        return super().get_ordering(request, queryset, view)
