"""GPU Portal's Python SDK: submit jobs and follow them, launch instances and notebooks.

from gpuportal import Client

portal = Client.from_env()          # GPUPORTAL_URL / GPUPORTAL_TOKEN, or `gpuportal login`
job = portal.jobs.submit("job.yaml")
job.wait()
print(job.logs())
job.download_artifacts("results/")
"""

__version__ = "0.1.0"

from gpuportal.client import Client  # noqa: E402 - the client reads __version__
from gpuportal.errors import (  # noqa: E402
    APIError,
    ArtifactError,
    AuthenticationError,
    ConfigError,
    Conflict,
    GPUPortalError,
    LimitExceeded,
    NotFound,
    PermissionDenied,
    PortalUnreachable,
    ServerError,
    SpecError,
    ValidationError,
    WaitTimeout,
    WorkloadFailed,
)
from gpuportal.models import (  # noqa: E402
    Artifact,
    ComputeProfile,
    Instance,
    Job,
    LogChunk,
    Notebook,
    NotebookProfile,
    QueueInfo,
    User,
    Workspace,
)
from gpuportal.spec import JobSpec  # noqa: E402

__all__ = [
    "APIError", "Artifact", "ArtifactError", "AuthenticationError", "Client", "ComputeProfile", "ConfigError",
    "Conflict", "GPUPortalError", "Instance", "Job", "JobSpec", "LimitExceeded", "LogChunk", "Notebook",
    "NotebookProfile", "NotFound", "PermissionDenied", "PortalUnreachable", "QueueInfo", "ServerError",
    "SpecError", "User", "ValidationError", "WaitTimeout", "WorkloadFailed", "Workspace", "__version__",
]  # fmt: skip
