from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request


class Pagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request: Request) -> int:
        """The asked page size; a value that is not a whole number from 1 to 500 is a 400, not ignored."""
        raw = request.query_params.getlist(self.page_size_query_param)
        if not raw:
            return self.page_size
        if len(raw) > 1 or not raw[0].isdigit() or not 1 <= int(raw[0]) <= self.max_page_size:
            message = f"A page size is a whole number from 1 to {self.max_page_size}."
            raise ValidationError({self.page_size_query_param: [message]})
        return int(raw[0])

    def get_page_number(self, request: Request, paginator: Any) -> Any:
        """The asked page: a whole number from 1 (the schema says so); a page past the end is a 404."""
        raw = request.query_params.getlist(self.page_query_param)
        if raw and (len(raw) > 1 or not raw[0].isdigit() or int(raw[0]) < 1) and raw[0] not in self.last_page_strings:
            raise ValidationError({self.page_query_param: ["A page is a whole number from 1."]})
        return super().get_page_number(request, paginator)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 1}
            elif parameter["name"] == self.page_size_query_param:
                parameter["schema"] = {"type": "integer", "minimum": 1, "maximum": self.max_page_size}
        return parameters
