"""GPU Portal's Python SDK: submit jobs and follow them, launch instances, notebooks and Ray
clusters (``gpuportal.ray``: CodeFlare's ``Cluster``, ``ClusterConfiguration`` and ``RayJob``),
deploy models at inference endpoints (``client.endpoints``), reserve GPUs ahead of time
(``client.gprs``).

from gpuportal import Client

portal = Client.from_env()          # GPUPORTAL_URL / GPUPORTAL_TOKEN, or `gpuportal login`
job = portal.jobs.submit("job.yaml")
job.wait()
print(job.logs())
job.download_artifacts("results/")
"""

__version__ = "0.1.0"

from gpuportal.client import Client  # noqa: E402 - the client reads __version__
from gpuportal.endpoints import Endpoint, EndpointReplica, EndpointSample, ReplicaLog, ScaleEvent  # noqa: E402
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
from gpuportal.gprs import GPR, GPREstimate, GPREvent, Reservation  # noqa: E402
from gpuportal.models import (  # noqa: E402
    Artifact,
    ComputeProfile,
    InferenceProfile,
    Instance,
    Job,
    LogChunk,
    Notebook,
    NotebookProfile,
    QueueInfo,
    StartStep,
    User,
    Workspace,
)
from gpuportal.ray import Cluster, ClusterConfiguration, CodeFlareClusterStatus, RayJob  # noqa: E402
from gpuportal.rayclusters import ClusterStatus, RayCluster, RayNode  # noqa: E402
from gpuportal.rayspec import RayClusterSpec  # noqa: E402
from gpuportal.spec import JobSpec  # noqa: E402
from gpuportal.workloads import Workload  # noqa: E402

__all__ = [
    "APIError", "Artifact", "ArtifactError", "AuthenticationError", "Client", "Cluster", "ClusterConfiguration",
    "ClusterStatus", "CodeFlareClusterStatus", "ComputeProfile", "ConfigError", "Conflict", "Endpoint",
    "EndpointReplica", "EndpointSample", "GPR", "GPREstimate", "GPREvent", "GPUPortalError", "InferenceProfile",
    "Instance", "Job", "JobSpec", "LimitExceeded", "LogChunk", "Notebook", "NotebookProfile", "NotFound",
    "PermissionDenied", "PortalUnreachable", "QueueInfo", "RayCluster", "RayClusterSpec", "RayJob", "RayNode",
    "ReplicaLog", "Reservation", "ScaleEvent", "ServerError", "SpecError", "StartStep", "User", "ValidationError",
    "WaitTimeout", "Workload", "WorkloadFailed", "Workspace", "__version__",
]  # fmt: skip
