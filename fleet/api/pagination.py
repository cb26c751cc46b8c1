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
        number = _whole(request.query_params, "page", 1, INT_MAX)
        try:
            return super().paginate_queryset(queryset, request, view)
        except NotFound:
            # A well-formed page past the last one: there is nothing there (404).
            raise NotFound(f"There is no page {number}; the list has fewer pages.")

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        bounds = {"page": (1, INT_MAX), "page_size": (1, self.max_page_size)}
        for parameter in parameters:
            if parameter["name"] in bounds:
                low, high = bounds[parameter["name"]]
                parameter["schema"].update(minimum=low, maximum=high)
        return parameters


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

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        fields = [f for f in getattr(view, "ordering_fields", None) or [] if isinstance(f, str)]
        for parameter in parameters:
            if parameter["name"] == self.ordering_param and fields:
                choices = sorted(fields + [f"-{f}" for f in fields])
                parameter["schema"] = {"type": "string", "enum": choices}
                parameter["description"] = (
                    "Sort by this field (prefix - to reverse; several, comma-separated)."
                )
        return parameters
