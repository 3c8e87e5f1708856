"""The ``autoscaling.x-k8s.io/v1`` ProvisioningRequest's spec, as its CustomResourceDefinition publishes it.

No package ships the cluster autoscaler's CRDs, so the part of its OpenAPI v3 schema the portal writes is written
out here by hand, from ``cluster-autoscaler/apis/config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml`` of
kubernetes/autoscaler (controller-gen v0.20.1; the Go types are ``apis/provisioningrequest/autoscaling.x-k8s.io/
v1/types.go``): required fields, types, limits and patterns, and ``additionalProperties: false`` where the API
server prunes unknown fields (which the CRD's structural schema implies), so that a misspelt field fails here.
"""

from __future__ import annotations

from typing import Any

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "autoscaling.x-k8s.io/v1"},
        "kind": {"const": "ProvisioningRequest"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["podSets", "provisioningClassName"],
            "additionalProperties": False,
            "properties": {
                "parameters": {
                    "type": "object",
                    "maxProperties": 100,
                    "additionalProperties": {"type": "string", "maxLength": 255},
                },
                "podSets": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 32,
                    "items": {
                        "type": "object",
                        "required": ["count", "podTemplateRef"],
                        "additionalProperties": False,
                        "properties": {
                            "count": {"type": "integer", "minimum": 1, "maximum": 2**31 - 1},
                            "podTemplateRef": {
                                "type": "object",
                                "required": ["name"],
                                "additionalProperties": False,
                                "properties": {"name": {"type": "string", "maxLength": 253, "pattern": NAME_PATTERN}},
                            },
                        },
                    },
                },
                "provisioningClassName": {"type": "string", "maxLength": 253, "pattern": NAME_PATTERN},
            },
        },
        "status": {"type": "object"},
    },
}
