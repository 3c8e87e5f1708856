"""The platform as manifests (``/api/v1/admin/manifests/``), for platform admins: ``GET`` exports
today's platform as documents; ``POST`` applies documents (or, with ``dry_run``, only plans them)
in one transaction and answers the plan. See docs/manifests.md."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.api.strict import StrictSerializer
from apps.api.views import IsPlatformAdmin
from apps.errors import RULE
from apps.manifests.engine import MAX_DOCUMENTS, apply_documents, export_documents
from apps.manifests.kinds import API_VERSION, Context


@extend_schema_field({"type": "object", "additionalProperties": True})
class ManifestField(serializers.JSONField):
    """A document is an object; anything else sent is still taken, to be refused naming its file and
    position (as every other document's refusal is) rather than as a malformed request."""


class DocumentSerializer(StrictSerializer):
    source = serializers.CharField(max_length=500, required=False, help_text="The file the document came from.")
    index = serializers.IntegerField(min_value=1, required=False, help_text="Its position in that file, from 1.")
    manifest = ManifestField(help_text="The document: apiVersion, kind, metadata.name, spec.")


class ApplySerializer(StrictSerializer):
    documents = serializers.ListField(child=DocumentSerializer(), max_length=MAX_DOCUMENTS)
    dry_run = serializers.BooleanField(default=False, help_text="Answer the plan and write nothing.")
    prune = serializers.BooleanField(
        default=False, help_text="Also delete the objects of the kinds the documents name that no document names."
    )


CHANGE = inline_serializer("ManifestResult", many=True, fields={
    "source": serializers.CharField(allow_null=True), "index": serializers.IntegerField(allow_null=True),
    "kind": serializers.CharField(), "name": serializers.CharField(),
    "action": serializers.ChoiceField(["created", "changed", "unchanged", "deleted"]),
    "changes": serializers.ListField(child=serializers.DictField()),
})  # fmt: skip
PLAN = inline_serializer("ManifestPlan", {
    "dry_run": serializers.BooleanField(), "applied": serializers.BooleanField(),
    "summary": serializers.DictField(child=serializers.IntegerField()), "documents": CHANGE,
})  # fmt: skip
EXPORT = inline_serializer("ManifestExport", {
    "apiVersion": serializers.CharField(), "kind": serializers.CharField(),
    "items": serializers.ListField(child=serializers.DictField()),
})  # fmt: skip


class ManifestsView(APIView):
    permission_classes = [IsPlatformAdmin]

    @extend_schema(responses=EXPORT, summary="Today's platform as manifest documents",
                   operation_id="v1_admin_manifests_export")  # fmt: skip
    def get(self, request: Request) -> Response:
        items = export_documents(Context(request))
        return Response({"apiVersion": API_VERSION, "kind": "List", "items": items})

    @extend_schema(request=ApplySerializer, responses={200: PLAN}, summary="Apply (or plan) manifest documents",
                   operation_id="v1_admin_manifests_apply")  # fmt: skip
    def post(self, request: Request) -> Response:
        body = ApplySerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        data = body.validated_data
        outcome = apply_documents(data["documents"], ctx=Context(request), dry_run=data["dry_run"],
                                  prune=data["prune"])  # fmt: skip
        if outcome.problems:
            problems = [p.as_dict() for p in outcome.problems]
            count = len(problems)
            message = problems[0]["text"] + (f" (and {count - 1} more)" if count > 1 else "")
            # A document's refusal is its kind's rule (the schema says only that a manifest is an
            # object), coded as the API's other refusals by rule are.
            error = {"status": 400, "code": "invalid", "message": message,
                     "fields": {"documents": [p["text"] for p in problems]},
                     "field_codes": {"documents": [RULE] * count}, "problems": problems}  # fmt: skip
            return Response({"error": error}, status=400)
        return Response(plan(outcome.results, dry_run=data["dry_run"], applied=outcome.applied))


def plan(results: list[dict[str, Any]], *, dry_run: bool, applied: bool) -> dict[str, Any]:
    summary = {action: 0 for action in ("created", "changed", "unchanged", "deleted")}
    for result in results:
        summary[result["action"]] += 1
    return {"dry_run": dry_run, "applied": applied, "summary": summary, "documents": results}
