"""The check notebook servers make before letting a request through (see workers/notebook)."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.compute.models import Notebook
from apps.workspaces.access import CHANGE, VIEW, restrict


class NotebookAccessView(APIView):
    """200 with the username when the request's own credentials (session or API token) belong
    to someone who may use the notebook: today, a member or owner of its workspace. A viewer is
    refused (403); anyone who cannot see the workspace gets 404, as everywhere in the API."""

    schema = None  # internal: called by notebook servers, not part of the public API

    def get(self, request: Request, workspace: str, notebook: str) -> Response:
        live = Notebook.objects.filter(workspace__name=workspace, name=notebook, state__in=Notebook.LIVE_STATES)
        if not restrict(live, request.user, VIEW).exists():
            raise NotFound(f"No notebook {workspace}/{notebook}.")
        if not restrict(live, request.user, CHANGE).exists():
            raise PermissionDenied(f"Viewers of {workspace} cannot open its notebooks; ask an owner for member access.")
        user: Any = request.user
        return Response({"username": user.get_username()})
