"""Validators shared by every app: names are DNS-1123 labels, so they work as Kubernetes
namespaces, Slurm job names, URL segments and directory names alike."""

import re

from django.core.validators import RegexValidator

DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_LABEL_MESSAGE = (
    "Use 1 to 63 lowercase letters, digits or '-', starting and ending with a letter or digit "
    "(a DNS-1123 label), e.g. 'resnet-train-2'."
)
GPU_TYPE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$")

validate_dns_label = RegexValidator(DNS_LABEL_RE, DNS_LABEL_MESSAGE, code="invalid_name")
validate_gpu_type = RegexValidator(
    GPU_TYPE_RE, "A GPU type is a short lowercase name such as 'h100' or 'a100-80gb'.", code="invalid_gpu_type"
)
