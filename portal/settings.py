"""GPU Portal settings: one module, driven by environment variables.

With no variables set this is the embedded default (SQLite, a filesystem broker, an in-memory
channel layer, the local backend). Production sets PORTAL_ENV=production and names its
database, Redis and secrets through the environment; see docs/configuration.md.
"""

from __future__ import annotations

import ipaddress
import secrets
from pathlib import Path

import dj_database_url
from csp.constants import NONCE
from django.core.exceptions import ImproperlyConfigured

from portal.env import env_bool, env_choice, env_int, env_list, env_secret, env_str

BASE_DIR = Path(__file__).resolve().parent.parent

PORTAL_ENV = env_choice("PORTAL_ENV", ("embedded", "production"), "embedded")
PRODUCTION = PORTAL_ENV == "production"
DATA_DIR = Path(env_str("PORTAL_DATA_DIR", str(BASE_DIR / "var"))).resolve()


def _embedded_secret(name: str) -> str:
    """The embedded default keeps generated secrets in its data directory, so they survive restarts
    (the secret key: sessions)."""
    path = DATA_DIR / name
    if not path.exists():
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = env_secret("SECRET_KEY")
if not SECRET_KEY:
    if PRODUCTION:
        raise ImproperlyConfigured("SECRET_KEY (or SECRET_KEY_FILE) must be set when PORTAL_ENV=production.")
    SECRET_KEY = _embedded_secret("secret_key")
if PRODUCTION and len(SECRET_KEY) < 50:
    raise ImproperlyConfigured("SECRET_KEY must be at least 50 characters long.")

DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", [] if PRODUCTION else ["127.0.0.1", "localhost", "[::1]"])
if PRODUCTION and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("ALLOWED_HOSTS must list the portal's host names when PORTAL_ENV=production.")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "apps.accounts",
    "apps.audit",
    "apps.workspaces",
    "apps.invitations",
    "apps.monitoring",
    "apps.telemetry",
    "apps.accounting",
    "apps.catalog",
    "apps.inventory",
    "apps.workloads",
    "apps.compute",
    "apps.jobs",
    "apps.rayclusters",
    "apps.inference",
    "apps.provisioning",
    "apps.elastic",
    "apps.scheduling",
    "apps.web",
    "apps.console",
    "apps.alerts",
    "apps.manifests",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_permissions_policy.PermissionsPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"
ASGI_APPLICATION = "portal.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "apps.web.context.sandbox",
                "apps.inventory.context.maintenance",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
DATABASE_URL = env_secret("DATABASE_URL")
if PRODUCTION and not DATABASE_URL:
    raise ImproperlyConfigured("DATABASE_URL must name a PostgreSQL database when PORTAL_ENV=production.")
# PostgreSQL connections come from a pool in each process (psycopg's, DATABASE_POOL_MAX each):
# Daphne runs each request's database work on a thread of its own, and connections kept per
# thread (CONN_MAX_AGE) piled up under a burst until PostgreSQL refused new clients.
DATABASE_POOL_MAX = env_int("DATABASE_POOL_MAX", 10, minimum=0, maximum=1000)
DATABASE_POOL_TIMEOUT_S = env_int("DATABASE_POOL_TIMEOUT_S", 10, minimum=1, maximum=600)
if DATABASE_URL:
    try:
        _database = dj_database_url.parse(DATABASE_URL, conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 0))
    except ValueError as exc:
        raise ImproperlyConfigured(f"DATABASE_URL cannot be parsed: {exc}") from None
    if _database["ENGINE"] == "django.db.backends.postgresql" and DATABASE_POOL_MAX:
        if _database["CONN_MAX_AGE"]:
            message = "DATABASE_CONN_MAX_AGE needs DATABASE_POOL_MAX=0: the pool reuses connections itself."
            raise ImproperlyConfigured(message)
        _database["CONN_HEALTH_CHECKS"] = True  # a pooled connection the server dropped is replaced, not used
        _database.setdefault("OPTIONS", {})["pool"] = {
            "min_size": min(2, DATABASE_POOL_MAX),
            "max_size": DATABASE_POOL_MAX,
            "timeout": DATABASE_POOL_TIMEOUT_S,
        }
else:
    _database = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DATA_DIR / "portal.sqlite3",
        # Web, worker and scheduler share one file: WAL and immediate transactions keep them
        # from failing each other with "database is locked".
        "OPTIONS": {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }
DATABASES = {"default": _database}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis, Celery, Channels ----------------------------------------------------------------
REDIS_URL = env_secret("REDIS_URL")
# What this portal's keys in Redis (its Celery queues, its Channels names) start with: portals that
# share one Redis database each take their own.
REDIS_PREFIX = env_str("PORTAL_REDIS_PREFIX", "")
# The embedded broker: kombu's filesystem transport with atomic writes (portal/broker.py).
CELERY_BROKER_URL = env_secret("CELERY_BROKER_URL", REDIS_URL) or "atomicfs://localhost//"
_FILE_BROKER = CELERY_BROKER_URL.startswith(("atomicfs://", "filesystem://"))
if PRODUCTION and _FILE_BROKER:
    raise ImproperlyConfigured("CELERY_BROKER_URL or REDIS_URL must be set when PORTAL_ENV=production.")
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
if _FILE_BROKER:
    _broker_dir = DATA_DIR / "broker"
    for _folder in ("queue", "processed", "results", "control"):
        (_broker_dir / _folder).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
        # An idle worker looks for new messages this often (kombu's default is 1 s, which would
        # add up to a second to every hop from a request to the worker).
        "polling_interval": 0.05,
    }
    CELERY_RESULT_BACKEND = f"file://{_broker_dir / 'results'}"
else:
    CELERY_RESULT_BACKEND = env_secret("CELERY_RESULT_BACKEND", REDIS_URL) or None
    if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
        # A task whose worker died before it ended (never acknowledged: acks late, below) goes back
        # on its queue this long after it was taken; longer than any task runs, or one still
        # running would be run a second time beside it (docs/operations.md, "Rolling restart").
        CELERY_BROKER_TRANSPORT_OPTIONS = {
            "visibility_timeout": env_int("PORTAL_TASK_VISIBILITY_TIMEOUT_S", 1800, minimum=1, maximum=86400)
        }
        if REDIS_PREFIX:
            # Portals sharing one Redis database keep their queues apart by it.
            CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"] = REDIS_PREFIX
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_RESULT_EXPIRES = 3600
CELERY_TASK_ACKS_LATE = True
# A task whose pool process died under it (killed, out of memory) is handed back to the queue, not
# recorded as failed: with acks late, a worker stopped mid-task leaves its task to another.
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Two queues, each with workers of its own: quick work (scheduling cycles, starts of jobs on this
# machine) on "celery", and whatever can take seconds to minutes (environment builds, instance and
# notebook starts, Slurm and Kubernetes starts, stops) on "provision", so that nothing slow ever
# delays a job's start or a cycle. workers/tasks.py's `route` says which task goes where.
CELERY_TASK_DEFAULT_QUEUE = "celery"
PROVISION_QUEUE = "provision"
CELERY_TASK_ROUTES = ("workers.tasks.route",)
CELERY_IMPORTS = ("workers.tasks",)  # the tasks, known by name to trigger.run_here and every worker

# Live updates cross processes (the worker and the scheduler loop change states too): Redis in
# production; without Redis, channels-lite's layer on a SQLite file of its own (not the portal's
# database, whose write lock it would contend for), which every process of the portal shares.
if REDIS_URL:
    # A socket's consumer waits on Redis with BZPOPMIN for 5 s at a time: the client's read timeout
    # must be longer, or every socket that hears nothing for 5 s dies (redis-py 8 reads for 5 s by
    # default; redis/redis-py#4091).
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [{"address": REDIS_URL, "socket_timeout": 15}],
                # Portals sharing one Redis database keep their live updates apart by it.
                "prefix": f"{REDIS_PREFIX}asgi",
            },
        }
    }
else:
    INSTALLED_APPS.append("channels_lite")
    DATABASES["channels"] = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DATA_DIR / "channels.sqlite3",
        "OPTIONS": {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }
    DATABASE_ROUTERS = ["channels_lite.router.ChannelsRouter"]
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_lite.layers.core.SQLiteChannelLayer",
            "CONFIG": {"database": "channels", "expiry": 60, "capacity": 1000, "polling_interval": 0.2},
        }
    }

# --- Auth -----------------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "/admin/login/"
# Where a sign-in through the provider that names no `next` page lands: the overview, as the
# password form's does (`next_page` in apps/web/signin.py). mozilla-django-oidc's callback reads this
# setting (through apps/accounts/oidc.get_settings); Django's default, /accounts/profile/, is no
# page of the portal's.
LOGIN_REDIRECT_URL = "web:landing"

# --- Mail (invitations; docs/identity.md) ------------------------------------------------------
# Through SMTP once EMAIL_HOST is set; else each message is written as a file under
# PORTAL_DATA_DIR/mail (the embedded portal prints where), so that a link can still be followed.
EMAIL_HOST = env_str("EMAIL_HOST").strip()
if EMAIL_HOST:
    EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    EMAIL_PORT = env_int("EMAIL_PORT", 587, minimum=1, maximum=65535)
    EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
    EMAIL_HOST_PASSWORD = env_secret("EMAIL_HOST_PASSWORD")
    EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", EMAIL_PORT == 587)
    EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", EMAIL_PORT == 465)
    if EMAIL_USE_TLS and EMAIL_USE_SSL:
        raise ImproperlyConfigured("EMAIL_USE_TLS and EMAIL_USE_SSL cannot both be on.")
else:
    EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
EMAIL_FILE_PATH = DATA_DIR / "mail"
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10, minimum=1, maximum=300)
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "GPU Portal <gpu-portal@localhost>")
# Invitations: how long a link lives, and how many a user, and a workspace, may send in an hour.
# /metrics answers a scraper that presents this bearer token; without one it is off. The embedded
# default keeps a generated one in its data directory.
PORTAL_METRICS_TOKEN = env_secret("PORTAL_METRICS_TOKEN") or ("" if PRODUCTION else _embedded_secret("metrics_token"))
# How often the scheduler loop reads the GPUs' telemetry (apps/telemetry), where a source exists.
PORTAL_TELEMETRY_EVERY_S = env_int("PORTAL_TELEMETRY_EVERY_S", 10, minimum=1, maximum=3600)
# Idle notebooks and workloads past their maximum runtime (apps/compute/culling.py): how often the
# scheduler loop looks, and how long before an idle stop the notebook's user is mailed.
PORTAL_CULL_EVERY_S = env_int("PORTAL_CULL_EVERY_S", 30, minimum=1, maximum=3600)
PORTAL_CULL_WARNING_S = env_int("PORTAL_CULL_WARNING_S", 600, minimum=0, maximum=86400)
# A GPU measured at least this busy (percent) keeps its instance's notebooks from being idle.
PORTAL_CULL_GPU_BUSY_PERCENT = env_int("PORTAL_CULL_GPU_BUSY_PERCENT", 5, minimum=0, maximum=100)
PORTAL_INVITATION_DAYS = env_int("PORTAL_INVITATION_DAYS", 7, minimum=1, maximum=90)
PORTAL_INVITATIONS_PER_USER_HOUR = env_int("PORTAL_INVITATIONS_PER_USER_HOUR", 20, minimum=1)
PORTAL_INVITATIONS_PER_WORKSPACE_HOUR = env_int("PORTAL_INVITATIONS_PER_WORKSPACE_HOUR", 50, minimum=1)
# Alerts (apps/alerts, docs/operations.md): how often the scheduler loop evaluates the rules, after
# how long a firing alert is sent again (0: never), and whether workspace owners' webhooks may
# reach loopback and private addresses (platform admins' always may).
PORTAL_ALERTS_EVERY_S = env_int("PORTAL_ALERTS_EVERY_S", 30, minimum=1, maximum=3600)
PORTAL_ALERTS_REPEAT_S = env_int("PORTAL_ALERTS_REPEAT_S", 4 * 3600, minimum=0, maximum=30 * 86400)
PORTAL_ALERTS_ALLOW_PRIVATE_WEBHOOKS = env_bool("PORTAL_ALERTS_ALLOW_PRIVATE_WEBHOOKS", False)

# --- Single sign-on through OpenID Connect (docs/identity.md) -----------------------------------
# Off unless PORTAL_OIDC_ISSUER names the provider. Its endpoints come from the issuer's discovery
# document (read when first needed, apps/accounts/oidc.py), or from the PORTAL_OIDC_*_ENDPOINT
# variables where set. With SSO on, passwords work only for PORTAL_BREAK_GLASS_ADMIN.
PORTAL_OIDC_ISSUER = env_str("PORTAL_OIDC_ISSUER").strip().rstrip("/")
PORTAL_OIDC_CLIENT_ID = env_str("PORTAL_OIDC_CLIENT_ID").strip()
PORTAL_OIDC_CLIENT_SECRET = env_secret("PORTAL_OIDC_CLIENT_SECRET")
PORTAL_OIDC_SCOPES = env_str("PORTAL_OIDC_SCOPES", "openid email profile").strip()
PORTAL_OIDC_GROUPS_CLAIM = env_str("PORTAL_OIDC_GROUPS_CLAIM", "groups").strip()
PORTAL_OIDC_USERNAME_CLAIM = env_str("PORTAL_OIDC_USERNAME_CLAIM", "preferred_username").strip()
# Members of any of these provider groups are platform admins (and only they, among SSO users).
PORTAL_OIDC_ADMIN_GROUPS = env_list("PORTAL_OIDC_ADMIN_GROUPS")
PORTAL_OIDC_PROVIDER_NAME = env_str("PORTAL_OIDC_PROVIDER_NAME", "single sign-on").strip()
PORTAL_OIDC_AUTHORIZATION_ENDPOINT = env_str("PORTAL_OIDC_AUTHORIZATION_ENDPOINT").strip()
PORTAL_OIDC_TOKEN_ENDPOINT = env_str("PORTAL_OIDC_TOKEN_ENDPOINT").strip()
PORTAL_OIDC_USERINFO_ENDPOINT = env_str("PORTAL_OIDC_USERINFO_ENDPOINT").strip()
PORTAL_OIDC_JWKS_URI = env_str("PORTAL_OIDC_JWKS_URI").strip()
PORTAL_OIDC_END_SESSION_ENDPOINT = env_str("PORTAL_OIDC_END_SESSION_ENDPOINT").strip()
PORTAL_BREAK_GLASS_ADMIN = env_str("PORTAL_BREAK_GLASS_ADMIN").strip()
if PORTAL_OIDC_ISSUER and not (PORTAL_OIDC_CLIENT_ID and PORTAL_OIDC_CLIENT_SECRET):
    raise ImproperlyConfigured("PORTAL_OIDC_ISSUER needs PORTAL_OIDC_CLIENT_ID and PORTAL_OIDC_CLIENT_SECRET.")
if PRODUCTION and PORTAL_OIDC_ISSUER and not PORTAL_OIDC_ISSUER.startswith("https://"):
    raise ImproperlyConfigured("PORTAL_OIDC_ISSUER must be an https:// address in production.")
AUTHENTICATION_BACKENDS = ["apps.accounts.oidc.PasswordBackend", "apps.accounts.oidc.SsoBackend"]
# mozilla-django-oidc's own settings; its client id, secret, scopes and the provider's endpoints are
# read from the PORTAL_OIDC_* settings above by apps/accounts/oidc.py.
OIDC_RP_SIGN_ALGO = "RS256"
OIDC_USE_PKCE = True
OIDC_STORE_ID_TOKEN = True  # for the provider's logout (id_token_hint)
OIDC_TIMEOUT = 10
OIDC_AUTHENTICATION_CALLBACK_URL = "web:sso-callback"
# A session that came through the provider is checked with it again once it is this old (silently,
# prompt=none, at the next page opened; other requests wait for that): if the provider no longer
# signs the user in, the session and the user's other access end (apps/accounts/sso_session.py).
PORTAL_OIDC_SESSION_CHECK_S = env_int("PORTAL_OIDC_SESSION_CHECK_S", 900, minimum=30, maximum=86400)
# The longest life of a personal API token of a user who signs in through the provider (capped at
# creation; an older, longer one stops working once this old).
PORTAL_SSO_TOKEN_MAX_DAYS = env_int("PORTAL_SSO_TOKEN_MAX_DAYS", 7, minimum=1, maximum=3650)
MIDDLEWARE.insert(
    MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1,
    "apps.accounts.sso_session.SsoSessionCheck",
)

# --- Client addresses (apps/accounts/addresses.py) --------------------------------------------
# The proxies whose X-Forwarded-For is believed: addresses or networks. The embedded portal's
# notebook proxy reaches the web process on loopback. The sign-in limits never count a trusted
# proxy's own address as one client's.
PORTAL_TRUSTED_PROXIES = env_list("PORTAL_TRUSTED_PROXIES", ["127.0.0.1", "::1"])
for _proxy in PORTAL_TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_proxy, strict=False)
    except ValueError:
        raise ImproperlyConfigured(
            f"PORTAL_TRUSTED_PROXIES: {_proxy!r} is not an IP address or network (e.g. 10.0.0.5 or 10.0.0.0/24)."
        ) from None

# --- Security (production defaults on, overridable for a TLS-terminating proxy) ---------------
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", PRODUCTION)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", PRODUCTION)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", PRODUCTION)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000 if PRODUCTION else 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", PRODUCTION)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", PRODUCTION)
if env_bool("SECURE_PROXY_SSL_HEADER", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
# Every page's Content-Security-Policy (django-csp): scripts and styles only from the portal's own
# static files, never inline, never eval. 'self' also covers the pages' WebSockets (ws:/wss: of the
# same host) in CSP Level 3 browsers. The API docs' set-up scripts (Swagger UI's holds the CSRF token,
# so it stays in the page rather than in a script URL another site could include) and the style
# elements Redoc writes carry a nonce made for that response (templates/drf_spectacular/); a page
# that uses no nonce gets none in its policy.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'", NONCE],
        "style-src": ["'self'", NONCE],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}
# Signing out of a portal with single sign-on is a form posted here that the portal answers with a
# redirect to the provider's logout page: form-action must allow the provider's origin too.
if PORTAL_OIDC_ISSUER:
    from urllib.parse import urlsplit as _urlsplit

    for _address in (PORTAL_OIDC_ISSUER, PORTAL_OIDC_END_SESSION_ENDPOINT):
        if _address:
            _origin = "{0.scheme}://{0.netloc}".format(_urlsplit(_address))
            CONTENT_SECURITY_POLICY["DIRECTIVES"]["form-action"].append(_origin)
# Browser features no page uses are off for the portal and anything it could embed; the pages' copy
# buttons write to the clipboard.
_DENIED_FEATURES = (
    "accelerometer",
    "autoplay",
    "bluetooth",
    "browsing-topics",
    "camera",
    "clipboard-read",
    "display-capture",
    "geolocation",
    "gyroscope",
    "hid",
    "idle-detection",
    "local-fonts",
    "magnetometer",
    "microphone",
    "midi",
    "payment",
    "publickey-credentials-get",
    "screen-wake-lock",
    "serial",
    "usb",
    "window-management",
    "xr-spatial-tracking",
)
PERMISSIONS_POLICY = {feature: [] for feature in _DENIED_FEATURES} | {"clipboard-write": ["self"]}
DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024

# --- I18N, static -----------------------------------------------------------------------------
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "/static/"
STATIC_ROOT = Path(env_str("STATIC_ROOT", str(DATA_DIR / "static")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STATICFILES_DIRS = [
    BASE_DIR / "static",
    # The pages' third-party scripts, pinned in package.json and installed by npm (deploy/lib.sh).
    ("vendor/htmx", BASE_DIR / "node_modules" / "htmx.org" / "dist"),
    ("vendor/chartjs", BASE_DIR / "node_modules" / "chart.js" / "dist"),
]
# A page rendered before collectstatic (tests, a fresh checkout) links the unhashed file name.
WHITENOISE_MANIFEST_STRICT = False
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

# --- REST API --------------------------------------------------------------------------------
REST_FRAMEWORK = {
    # Token first: a request without credentials gets 401 with `WWW-Authenticate: Token`, as
    # HTTP asks, rather than the 403 the session class would give. Both are tried either way.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.accounts.authentication.PortalTokenAuthentication",  # a user's token, or a workload's
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "apps.api.pagination.Pagination",
    "DEFAULT_FILTER_BACKENDS": [
        "apps.api.filters.KnownParameters",
        "apps.api.filters.WorkspaceFilter",
        "django_filters.rest_framework.DjangoFilterBackend",
        "rest_framework.filters.OrderingFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "apps.api.errors.exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["apps.api.parsers.SafeJSONParser"],
}
if DEBUG:
    REST_FRAMEWORK["DEFAULT_RENDERER_CLASSES"].append("rest_framework.renderers.BrowsableAPIRenderer")

SPECTACULAR_SETTINGS = {
    "TITLE": "GPU Portal API",
    "DESCRIPTION": "Workspaces, compute profiles, instances, notebooks, GPU jobs and inventory.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    # No badge from the public validator: it would send the schema's address to a third party, and
    # the Content-Security-Policy refuses its image anyway.
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": "none"},
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Every kind's `state` is the one workload column's: one enum, named for it.
    "ENUM_NAME_OVERRIDES": {"WorkloadStateEnum": "apps.workloads.models.STATE_CHOICES"},
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "apps.api.schema.add_error_responses",
    ],
}

# --- GPU Portal -------------------------------------------------------------------------------
# The local cluster's GPUs where NVML finds none: "COUNTxTYPE[,COUNTxTYPE...]", e.g. "8xh100".
PORTAL_DECLARED_GPUS = env_str("PORTAL_DECLARED_GPUS", "8xh100")
PORTAL_LOCAL_CPU_CORES = env_int("PORTAL_LOCAL_CPU_CORES", 64, minimum=1)
# Personal API tokens (apps/accounts/api_tokens.py): the longest life a user may give one, and the
# life of the one `gpuportal login` makes.
PORTAL_API_TOKEN_MAX_DAYS = env_int("PORTAL_API_TOKEN_MAX_DAYS", 365, minimum=1, maximum=3650)
PORTAL_LOGIN_TOKEN_DAYS = env_int("PORTAL_LOGIN_TOKEN_DAYS", 30, minimum=1, maximum=3650)
# How many tokens a user may make on the tokens page and through the API in an hour.
PORTAL_TOKENS_PER_USER_HOUR = env_int("PORTAL_TOKENS_PER_USER_HOUR", 30, minimum=1)
PORTAL_LOCAL_MEMORY_GB = env_int("PORTAL_LOCAL_MEMORY_GB", 512, minimum=1)
# How an action asks for a scheduling cycle once its transaction commits:
# "task" queues a Celery task, "inline" runs the cycle in-process, "off" leaves it to the loop.
PORTAL_SCHEDULER_TRIGGER = env_choice("PORTAL_SCHEDULER_TRIGGER", ("task", "inline", "off"), "task")
PORTAL_SCHEDULER_INTERVAL_S = env_int("PORTAL_SCHEDULER_INTERVAL_S", 2, minimum=1, maximum=3600)
# How an admission, a cancel or a preemption reaches the backend once committed: "task" (Celery),
# "inline" (in-process), "off" (the scheduler loop's reconcile picks it up).
PORTAL_WORKLOAD_TRIGGER = env_choice("PORTAL_WORKLOAD_TRIGGER", ("task", "inline", "off"), "task")
# Where the local backend keeps each job's directory: logs, artifacts.
# An admitted job the worker has not started after this long is started by the reconcile loop.
PORTAL_START_LOST_AFTER_S = env_int("PORTAL_START_LOST_AFTER_S", 30, minimum=1)
# A job's start that no worker has taken this long after its admission is made by the scheduler
# loop itself (apps/workloads/host.py): a worker may still run but no longer take work.
PORTAL_START_UNTAKEN_S = env_int("PORTAL_START_UNTAKEN_S", 60, minimum=1)
PORTAL_WORK_DIR = Path(env_str("PORTAL_WORK_DIR", str(DATA_DIR / "work")))
# The most of a job's output the portal records as its artifacts: files, and bytes in all (apparent
# sizes: a sparse file counts as large as it claims). Files past either are not recorded, and the
# job says so (apps/jobs/artifacts.py).
PORTAL_ARTIFACTS_MAX_FILES = env_int("PORTAL_ARTIFACTS_MAX_FILES", 10_000, minimum=0)
PORTAL_ARTIFACTS_MAX_BYTES = env_int("PORTAL_ARTIFACTS_MAX_BYTES", 10 * 1024**3, minimum=0)
# Tenant isolation of local workloads (docs/security.md). "bwrap": every job replica, instance and
# notebook runs in a bubblewrap sandbox that sees only its workspace (and, when the portal runs as
# root, as that workspace's own Unix account); a portal that cannot sandbox refuses to start user
# code. "off" is the explicit opt-out of a single-user workstation, shown as a warning on every page.
PORTAL_SANDBOX = env_choice("PORTAL_SANDBOX", ("bwrap", "off"), "bwrap")
# Resource limits of local workloads (docs/security.md). "cgroup": every job replica and instance
# (with its notebooks) is held by a cgroup (v2, or v1's memory, cpu and pids controllers, under
# PORTAL_CGROUP_ROOT) to the CPU cores and memory it asked for and PORTAL_WORKLOAD_PIDS_MAX processes
# and threads; a portal that cannot create cgroups refuses to start user code. "off" is the explicit
# opt-out of a single-user workstation, shown as a warning on every page.
PORTAL_RESOURCE_LIMITS = env_choice("PORTAL_RESOURCE_LIMITS", ("cgroup", "off"), "cgroup")
PORTAL_CGROUP_ROOT = env_str("PORTAL_CGROUP_ROOT", "/sys/fs/cgroup")
PORTAL_WORKLOAD_PIDS_MAX = env_int("PORTAL_WORKLOAD_PIDS_MAX", 4096, minimum=16, maximum=4194304)
# Disk quotas of local workloads (docs/security.md). "on": each workspace's directory is a filesystem
# image of the workspace's disk quota (PORTAL_WORKSPACE_DISK_GB for a new one; admins change it), kept
# in PORTAL_DISK_IMAGE_DIR and mounted on the directory, which needs root; a portal that cannot mount
# refuses to start user code. "off" is the explicit opt-out of a portal run as an ordinary user:
# workspaces then write without a limit, shown as a warning on every page.
PORTAL_DISK_QUOTA = env_choice("PORTAL_DISK_QUOTA", ("on", "off"), "on")
PORTAL_DISK_IMAGE_DIR = Path(env_str("PORTAL_DISK_IMAGE_DIR", str(DATA_DIR / "disks")))
PORTAL_WORKSPACE_DISK_GB = env_int("PORTAL_WORKSPACE_DISK_GB", 50, minimum=1, maximum=16_000)
# How often the scheduler loop measures each workspace's disk for its page (apps/workspaces/disks.py).
PORTAL_DISK_MEASURE_EVERY_S = env_int("PORTAL_DISK_MEASURE_EVERY_S", 60, minimum=5)
if PORTAL_DISK_IMAGE_DIR.resolve().is_relative_to(PORTAL_WORK_DIR.resolve()):
    raise ImproperlyConfigured("PORTAL_DISK_IMAGE_DIR must lie outside PORTAL_WORK_DIR, where no workload reaches.")
# The portal's private directory for the workloads' logs and exit files: no sandbox sees it.
PORTAL_RUN_DIR = Path(env_str("PORTAL_RUN_DIR", str(DATA_DIR / "run")))
# The most each replica's log on the local backend may hold, in MiB (it lies in PORTAL_RUN_DIR):
# past it the oldest part is dropped, the most recent kept, and the log says how much was dropped.
PORTAL_LOG_MAX_MB = env_int("PORTAL_LOG_MAX_MB", 100, minimum=1, maximum=1 << 20)
# Workspace accounts (when the portal runs as root; docs/security.md): the range is cut into blocks of
# PORTAL_WORKSPACE_UID_BLOCK_SIZE uids, and each installation (data directory) on a machine holds one,
# claimed in the machine's registry PORTAL_UID_REGISTRY_DIR (workers/backends/uidblocks.py): workspace N
# gets uid <block's first uid> + N, named gpw<uid>. PORTAL_WORKSPACE_UID_BLOCK asks for a block by number
# (machines sharing accounts, as Slurm's nodes do, must agree on it); unset, the first free one is taken.
# The range must be reserved for the portal on every machine that runs its work.
PORTAL_WORKSPACE_UID_MIN = env_int("PORTAL_WORKSPACE_UID_MIN", 200000, minimum=1000, maximum=2**31 - 2)
PORTAL_WORKSPACE_UID_MAX = env_int("PORTAL_WORKSPACE_UID_MAX", 10_199_999, minimum=1001, maximum=2**31 - 1)
if PORTAL_WORKSPACE_UID_MAX <= PORTAL_WORKSPACE_UID_MIN:
    raise ImproperlyConfigured("PORTAL_WORKSPACE_UID_MAX must be greater than PORTAL_WORKSPACE_UID_MIN.")
# A hundred installations of up to 100,000 workspaces each by default; a narrower range set by hand
# (200000-299999 in earlier releases) is one block.
PORTAL_WORKSPACE_UID_BLOCK_SIZE = env_int(
    "PORTAL_WORKSPACE_UID_BLOCK_SIZE",
    min(100_000, PORTAL_WORKSPACE_UID_MAX - PORTAL_WORKSPACE_UID_MIN + 1),
    minimum=100,
    maximum=2**30,
)
if PORTAL_WORKSPACE_UID_BLOCK_SIZE > PORTAL_WORKSPACE_UID_MAX - PORTAL_WORKSPACE_UID_MIN + 1:
    raise ImproperlyConfigured("PORTAL_WORKSPACE_UID_BLOCK_SIZE must fit in PORTAL_WORKSPACE_UID_MIN..MAX.")
PORTAL_WORKSPACE_UID_BLOCK: int | None = (
    env_int("PORTAL_WORKSPACE_UID_BLOCK", 0, minimum=0) if env_str("PORTAL_WORKSPACE_UID_BLOCK").strip() else None
)
PORTAL_UID_REGISTRY_DIR = Path(env_str("PORTAL_UID_REGISTRY_DIR", "/var/lib/gpuportal/uid-blocks"))
# Notebooks (docs/notebooks.md). The proxy in front of the portal that routes each notebook's
# own host name to its server (--host-routing): its REST API and that API's token.
PORTAL_PROXY_API_URL = env_str("PORTAL_PROXY_API_URL", "")
PORTAL_PROXY_AUTH_TOKEN = env_secret("PORTAL_PROXY_AUTH_TOKEN")
# How notebook servers reach the portal itself (to check who may use them), bypassing the proxy.
PORTAL_INTERNAL_URL = env_str("PORTAL_INTERNAL_URL", "http://127.0.0.1:8000")
# Each notebook on an origin of its own (docs/notebooks.md): http(s)://<name>-<id>.<PORTAL_NOTEBOOK_DOMAIN>[:port]/,
# with the scheme and port of PORTAL_PUBLIC_URL, the portal's own public address (the embedded launcher
# sets it). Production needs a wildcard DNS name and certificate for the domain; browsers resolve
# *.localhost to loopback, so the embedded default needs none. The portal's host names lie outside the
# domain, and its cookies stay host-only: none ever reaches a notebook.
PORTAL_PUBLIC_URL = env_str("PORTAL_PUBLIC_URL", "http://127.0.0.1:8000").strip().rstrip("/")
PORTAL_NOTEBOOK_DOMAIN = env_str("PORTAL_NOTEBOOK_DOMAIN", "" if PRODUCTION else "localhost").strip().strip(".").lower()


def _check_notebook_origins() -> None:
    from urllib.parse import urlsplit

    public = urlsplit(PORTAL_PUBLIC_URL)
    if public.scheme not in ("http", "https") or not public.hostname or public.path or public.query:
        raise ImproperlyConfigured(f"PORTAL_PUBLIC_URL={PORTAL_PUBLIC_URL!r} must be http(s)://host[:port], no path.")
    domain = PORTAL_NOTEBOOK_DOMAIN
    if not domain:
        raise ImproperlyConfigured("PORTAL_NOTEBOOK_DOMAIN must name the notebooks' wildcard domain in production.")
    if not all(0 < len(p) <= 63 and p.replace("-", "").isalnum() and p.isascii() for p in domain.split(".")):
        raise ImproperlyConfigured(f"PORTAL_NOTEBOOK_DOMAIN={domain!r} is not a DNS name.")

    def reaches_notebooks(host: str) -> bool:  # the host is a notebook's, or a pattern that matches them
        host = host.lower().rstrip(".")
        if host.startswith("."):
            return domain == host[1:] or domain.endswith(host)
        return host == "*" or host.endswith("." + domain)

    clashes = [h for h in [public.hostname, *ALLOWED_HOSTS] if reaches_notebooks(h)]
    if public.hostname == domain or clashes:
        raise ImproperlyConfigured(
            f"The portal's own host names ({', '.join(clashes) or public.hostname}) must lie outside "
            f"PORTAL_NOTEBOOK_DOMAIN ({domain}): notebooks are served there, on origins of their own."
        )


_check_notebook_origins()
SESSION_COOKIE_DOMAIN = None  # host-only: never sent to a notebook's host
CSRF_COOKIE_DOMAIN = None
MIDDLEWARE.insert(0, "apps.compute.middleware.NotebookHostMiddleware")  # before Django's host check
# Where the local and Slurm backends keep the notebook profiles' Python environments.
PORTAL_NOTEBOOK_ENV_DIR = Path(env_str("PORTAL_NOTEBOOK_ENV_DIR", str(DATA_DIR / "envs")))
# Build the shared environments (the SDK's, each published notebook profile's) when a provisioning
# worker starts and when a profile is published, before any start waits for them.
PORTAL_PREBUILD_ENVIRONMENTS = env_bool("PORTAL_PREBUILD_ENVIRONMENTS", True)
# The Python that Slurm notebook environments are built with: the workspaces' accounts on the
# cluster's nodes must be able to run it (empty: the portal's own interpreter).
PORTAL_NOTEBOOK_PYTHON = env_str("PORTAL_NOTEBOOK_PYTHON", "")
PORTAL_NOTEBOOK_START_TIMEOUT_S = env_int("PORTAL_NOTEBOOK_START_TIMEOUT_S", 120, minimum=5, maximum=3600)
# How long an instance's start may take before it fails (a Slurm batch job to run, pods to come up).
PORTAL_INSTANCE_START_TIMEOUT_S = env_int("PORTAL_INSTANCE_START_TIMEOUT_S", 300, minimum=10)
# A notebook or instance whose processes died is restarted this many times in a row, then failed.
PORTAL_RESTART_LIMIT = env_int("PORTAL_RESTART_LIMIT", 3, minimum=0, maximum=100)
# The cluster policy (docs/scheduler.md): "portal" (fair share, borrowing, preemption, backfill)
# or "fifo" (per-workspace hard quota and FIFO queue, as most labs run today).
PORTAL_SCHEDULER_POLICY = env_choice("PORTAL_SCHEDULER_POLICY", ("portal", "fifo"), "portal")
PORTAL_FAIR_SHARE_HALF_LIFE_S = env_int("PORTAL_FAIR_SHARE_HALF_LIFE_S", 7 * 86400, minimum=60)
PORTAL_PREEMPTION = env_bool("PORTAL_PREEMPTION", True)
PORTAL_PREEMPTION_MIN_RUNTIME_S = env_int("PORTAL_PREEMPTION_MIN_RUNTIME_S", 600, minimum=0)
PORTAL_PREEMPTION_GRACE_S = env_int("PORTAL_PREEMPTION_GRACE_S", 60, minimum=0, maximum=3600)
PORTAL_STARVATION_S = env_int("PORTAL_STARVATION_S", 3600, minimum=0)
# Where working out estimated starts costs the scheduler much (a long line), they are worked out
# less often than every cycle, but are never older than this (docs/scheduler.md).
PORTAL_ESTIMATES_MAX_AGE_S = env_int("PORTAL_ESTIMATES_MAX_AGE_S", 30, minimum=0, maximum=3600)
# An admitted gang not running after this long is requeued, with backoff doubling per requeue.
PORTAL_GANG_READY_TIMEOUT_S = env_int("PORTAL_GANG_READY_TIMEOUT_S", 900, minimum=10)
# How long a Ray cluster may take for every node to join (environment built, `ray start`s done).
PORTAL_RAY_START_TIMEOUT_S = env_int("PORTAL_RAY_START_TIMEOUT_S", 300, minimum=10, maximum=3600)
# Inference endpoints (docs/inference.md): how long a replica's server may take to load its model
# and answer; the scheduling priority, within the unattended class, of an endpoint's replicas above
# its minimum (which give way first); how long a request may wait for a replica when the client does not say
# (``Prefer: wait=N``); and the largest request body the endpoint proxy takes.
PORTAL_INFERENCE_START_TIMEOUT_S = env_int("PORTAL_INFERENCE_START_TIMEOUT_S", 600, minimum=5, maximum=7200)
PORTAL_INFERENCE_EXTRA_PRIORITY = env_int("PORTAL_INFERENCE_EXTRA_PRIORITY", -1000, minimum=-1000, maximum=1000)
# A node's drain replaces an endpoint's replicas there before it stops them: how long it waits for
# a replacement to serve (placed and its model loaded) before it stops the replica anyway.
PORTAL_DRAIN_REPLACE_S = env_int("PORTAL_DRAIN_REPLACE_S", 900, minimum=0, maximum=86400)
PORTAL_INFERENCE_WAIT_S = env_int("PORTAL_INFERENCE_WAIT_S", 60, minimum=0, maximum=3600)
PORTAL_INFERENCE_MAX_BODY_BYTES = env_int("PORTAL_INFERENCE_MAX_BODY_BYTES", 4 * 2**20, minimum=1024)

# GPU provisioning requests (docs/provisioning.md): a workspace's defaults where it has no policy of
# its own: approved at once up to this long within its quota (0: an admin decides each), and the
# longest any request may be.
PORTAL_GPR_AUTO_APPROVE_MAX_S = env_int("PORTAL_GPR_AUTO_APPROVE_MAX_S", 86400, minimum=0, maximum=366 * 86400)
PORTAL_GPR_MAX_DURATION_S = env_int("PORTAL_GPR_MAX_DURATION_S", 14 * 86400, minimum=600, maximum=366 * 86400)
# The holder is warned this long before its reservation ends; a reservation its holder runs nothing
# on for this long is reported idle.
PORTAL_GPR_WARN_BEFORE_S = env_int("PORTAL_GPR_WARN_BEFORE_S", 3600, minimum=60, maximum=7 * 86400)
PORTAL_GPR_IDLE_S = env_int("PORTAL_GPR_IDLE_S", 1800, minimum=60, maximum=7 * 86400)
PORTAL_GANG_BACKOFF_S = env_int("PORTAL_GANG_BACKOFF_S", 60, minimum=1)
PORTAL_GANG_BACKOFF_MAX_S = env_int("PORTAL_GANG_BACKOFF_MAX_S", 3600, minimum=1)
# Limits a new private workspace gets; admins change them per workspace.
PORTAL_PRIVATE_GPU_QUOTA = env_str("PORTAL_PRIVATE_GPU_QUOTA", "h100=1")
PORTAL_PRIVATE_MAX_INSTANCES = env_int("PORTAL_PRIVATE_MAX_INSTANCES", 2, minimum=0)
PORTAL_PRIVATE_MAX_NOTEBOOKS = env_int("PORTAL_PRIVATE_MAX_NOTEBOOKS", 2, minimum=0)
PORTAL_PRIVATE_CPU_CORES = env_int("PORTAL_PRIVATE_CPU_CORES", 16, minimum=0)
PORTAL_PRIVATE_MEMORY_GB = env_int("PORTAL_PRIVATE_MEMORY_GB", 64, minimum=0)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO").upper()},
    "loggers": {"django.request": {"level": "ERROR"}},
}
