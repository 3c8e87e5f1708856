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
