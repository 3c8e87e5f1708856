"""The sign-in page: Django's own, refusing with 429 while its account (however its name is typed)
or its client's address has failed too often (apps/accounts/throttle.py), without checking the
password."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse

from apps.accounts import throttle
from apps.web import sso


class SignIn(auth_views.LoginView):
    template_name = "web/login.html"
    redirect_authenticated_user = True
    next_page = "web:landing"

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        # With single sign-on the page leads with the provider's button; the password form stays,
        # for the break-glass admin alone (apps/accounts/oidc.py refuses everyone else's password).
        return {**super().get_context_data(**kwargs), **sso.sso_context()}

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        wait = throttle.retry_after(request.POST.get("username", ""), request)
        if not wait:
            return super().post(request, *args, **kwargs)
        form = self.get_form_class()(request, initial={"username": request.POST.get("username", "")})
        response = self.render_to_response(self.get_context_data(form=form, throttled=throttle.message(wait)))
        response.status_code = 429
        response["Retry-After"] = str(wait)
        return response
