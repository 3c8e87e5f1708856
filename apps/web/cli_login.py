"""Allowing a sign-in of the CLI (apps/accounts/device_login.py): the person, signed in here, checks
that the code is the one their terminal shows and allows it, or refuses it. The page names what
asked (the token's name, the address it came from, when), since a code can be passed on by someone
else: allow only a code you started yourself."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.cache import never_cache

from apps.accounts import device_login
from apps.web.common import page, signed_in


@never_cache
@signed_in
def cli_login(request: HttpRequest) -> HttpResponse:
    code = device_login.normalize(request.POST.get("code") or request.GET.get("code") or "")[:20]
    row = device_login.pending(code) if code else None
    if request.method == "POST" and request.POST.get("decision") in ("allow", "refuse"):
        allow = request.POST["decision"] == "allow"
        if row is None or not device_login.decide(row, request.user, allow=allow):
            messages.error(request, f"No sign-in waits for the code {code}: it expired, was used, or is mistyped.")
            return redirect("web:cli-login")
        if allow:
            messages.success(request, f"Allowed: the terminal showing {code} is signed in as you. Go back to it.")
        else:
            messages.success(request, f"Refused: the terminal showing {code} is not signed in.")
        return redirect("web:tokens")
    error = f"No sign-in waits for the code {code}: it expired, was used, or is mistyped." if code and not row else ""
    context = {"code": code, "login": row, "error": error}
    return page(request, "web/cli_login.html", context, status=404 if error else 200)
