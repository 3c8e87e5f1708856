from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth import authenticate, get_user_model, password_validation
from django.contrib.auth.models import Group, update_last_login
from django.urls import reverse
from django.utils import timezone
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import AuthenticationFailed, PermissionDenied
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts import actions, addresses, api_tokens, device_login, oidc, throttle
from apps.accounts.models import ApiToken, DeviceLogin, WorkloadUser
from apps.api.strict import StrictModelSerializer, StrictSerializer
from apps.api.views import IsPlatformAdmin, PortalViewSet
from apps.audit.actions import Origin, do_log_event
from apps.audit.events import Event
from apps.errors import TooMany
from apps.workspaces.access import restrict
from apps.workspaces.actions import ensure_private_workspace
from apps.workspaces.models import Workspace

User = get_user_model()
_TEXT = r"^[^\u0000-\u001f\u007f]+$"  # no control characters
_NAME = r"^[^\u0000-\u0020\u007f][^\u0000-\u001f\u007f]*$"  # and not starting with a space


class UserSerializer(StrictModelSerializer):
    username = serializers.RegexField(r"^[A-Za-z0-9_.@+-]+$", max_length=150)
    groups = serializers.SlugRelatedField(slug_field="name", queryset=Group.objects.all(), many=True, required=False)
    password = serializers.CharField(write_only=True, required=False, max_length=128, style={"input_type": "password"})

    class Meta:
        model = User
        fields = ["id", "username", "email", "first_name", "last_name", "is_staff", "is_active", "groups",
                  "password", "date_joined", "last_login"]  # fmt: skip
        read_only_fields = ["date_joined", "last_login"]

    def validate_password(self, value: str) -> str:
        password_validation.validate_password(value, self.instance)
        return value


class UserViewSet(PortalViewSet):
    """Users and their platform-admin flag and groups (platform admins only)."""

    serializer_class = UserSerializer
    permission_classes = [IsPlatformAdmin]
    queryset = User.objects.prefetch_related("groups").order_by("username")
    lookup_field = "username"
    lookup_value_regex = r"[\w.@+-]+"
    filterset_fields = ["is_staff", "is_active", "groups__name"]
    ordering_fields = ["username", "date_joined"]

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        serializer.instance = actions.do_save_user(User(), **serializer.validated_data, **self.action_kwargs())

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        serializer.instance = actions.do_save_user(
            serializer.instance, **serializer.validated_data, **self.action_kwargs()
        )

    def perform_destroy(self, instance: Any) -> None:
        actions.do_deactivate_user(instance, **self.action_kwargs())


class GroupSerializer(StrictModelSerializer):
    # Any letters (a team may be "Équipe"), no control characters.
    name = serializers.RegexField(r"^[^\u0000-\u001f\u007f]+$", max_length=150)
    members = serializers.SerializerMethodField()

    class Meta:
        model = Group
        fields = ["id", "name", "members"]

    def get_members(self, group: Group) -> list[str]:
        return [u.username for u in group.user_set.all()]


class GroupViewSet(PortalViewSet):
    """Groups: teams and departments that workspaces and profiles are assigned to (platform admins)."""

    serializer_class = GroupSerializer
    permission_classes = [IsPlatformAdmin]
    queryset = Group.objects.prefetch_related("user_set").order_by("name")
    lookup_field = "name"
    lookup_value_regex = r"[^/]+"
    ordering_fields = ["name"]

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        serializer.instance = actions.do_save_group(Group(), **serializer.validated_data, **self.action_kwargs())

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        serializer.instance = actions.do_save_group(
            serializer.instance, **serializer.validated_data, **self.action_kwargs()
        )

    def perform_destroy(self, instance: Group) -> None:
        actions.do_delete_group(instance, **self.action_kwargs())


class MeSerializer(StrictModelSerializer):
    groups = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)
    workspaces = serializers.SerializerMethodField()
    private_workspace = serializers.SerializerMethodField()

    class Meta:
        model = User
        fields = ["username", "email", "first_name", "last_name", "is_staff", "groups", "private_workspace",
                  "workspaces"]  # fmt: skip

    def get_workspaces(self, user: Any) -> list[str]:
        return list(restrict(Workspace.objects.all(), user).values_list("name", flat=True))

    def get_private_workspace(self, user: Any) -> str:
        return ensure_private_workspace(user).name


class MeView(APIView):
    """Who you are, your groups and the workspaces you can use."""

    @extend_schema(responses=MeSerializer)
    def get(self, request: Request) -> Response:
        return Response(MeSerializer(request.user).data)


class TokenView(APIView):
    """Exchange a username and password for a personal API token (for the CLI and SDK): read-write,
    for all of the user's workspaces, for `PORTAL_LOGIN_TOKEN_DAYS` days. It is listed with the
    user's other tokens and can be revoked like them."""

    permission_classes = [AllowAny]
    authentication_classes: list[Any] = []
    # Failed sign-ins are limited per account and per address (apps/accounts/throttle.py).

    def get_authenticate_header(self, request: Request) -> str:
        return "Token"  # a wrong password is a 401, as a wrong token is: credentials, not a role

    class Credentials(StrictSerializer):
        username = serializers.RegexField(_TEXT, max_length=150, trim_whitespace=False)
        password = serializers.CharField(max_length=128, style={"input_type": "password"}, trim_whitespace=False)
        name = serializers.RegexField(_NAME, max_length=100, required=False, help_text="what to call the token")

    @extend_schema(request=Credentials, responses=inline_serializer("Token", {"token": serializers.CharField()}))
    def post(self, request: Request) -> Response:
        credentials = self.Credentials(data=request.data, context={"request": request})
        credentials.is_valid(raise_exception=True)
        data = credentials.validated_data
        username = throttle.sign_in_name(data["username"])  # as the sign-in page reads it
        wait = throttle.retry_after(username, request._request)
        if wait:
            raise TooMany(throttle.message(wait), retry_after=wait)  # one sentence, and Retry-After
        user = authenticate(request._request, username=username, password=data["password"])
        if user is None:
            sso = " This portal signs in through single sign-on: run `gpuportal login --browser`."
            hint = sso if oidc.enabled() else ""
            raise AuthenticationFailed(f"Wrong username or password.{hint}")
        throttle.clear_account(user.get_username())
        ensure_private_workspace(user)
        update_last_login(None, user)  # an account used only through the API has been used too
        origin = Origin.from_request(request._request)
        do_log_event(Event.SIGN_IN, user, acting_user=user, origin=origin)
        _, text = api_tokens.do_create_token(
            user,
            name=data.get("name") or "gpuportal login",
            expires_in_days=settings.PORTAL_LOGIN_TOKEN_DAYS,
            acting_user=user,
            origin=origin,
        )
        return Response({"token": text})


class _WorkspaceName(serializers.SlugRelatedField):
    """A workspace by name, or null; not an empty name (which DRF would take for null)."""

    def run_validation(self, data: Any = serializers.empty) -> Any:
        if data == "":
            raise serializers.ValidationError("A workspace's name, or null for all of yours.")
        return super().run_validation(data)


class ApiTokenSerializer(StrictModelSerializer):
    name = serializers.RegexField(_NAME, max_length=100, help_text="what the token is for")
    expires_in_days = serializers.IntegerField(
        write_only=True, min_value=1, max_value=settings.PORTAL_API_TOKEN_MAX_DAYS, required=False,
        help_text="days until it expires (default 90; at most PORTAL_API_TOKEN_MAX_DAYS, 365 unless set, and "
        "for a user who signs in through single sign-on PORTAL_SSO_TOKEN_MAX_DAYS, 7 unless set)",
    )  # fmt: skip
    scope = serializers.ChoiceField(
        choices=ApiToken.Scope.choices, required=False, help_text="read (read-only) or write (read-write, the default)"
    )
    workspace = _WorkspaceName(
        slug_field="name", queryset=Workspace.objects.all(), required=False, allow_null=True,
        help_text="limit the token to this workspace (null or left out: all of yours)",
    )  # fmt: skip
    state = serializers.SerializerMethodField()
    endpoint = serializers.SerializerMethodField()

    class Meta:
        model = ApiToken
        fields = ["id", "name", "key_id", "scope", "workspace", "endpoint", "created_at", "expires_at",
                  "expires_in_days", "last_used_at", "revoked_at", "revoked_reason", "state"]  # fmt: skip
        read_only_fields = ["key_id", "created_at", "expires_at", "last_used_at", "revoked_at", "revoked_reason"]

    def get_endpoint(self, token: ApiToken) -> str | None:
        """The inference endpoint the token calls, alone (made on the endpoint: POST
        /api/v1/endpoints/<id>/tokens/); null for a token of the portal's API."""
        return token.endpoint.name if token.endpoint_id is not None and token.endpoint is not None else None

    def get_state(self, token: ApiToken) -> str:
        """active, expired or revoked"""
        if token.revoked_at is not None:
            return "revoked"
        return "expired" if self.expires_at_of(token) <= timezone.now() else "active"

    def expires_at_of(self, token: ApiToken) -> Any:
        """When the token stops working (apps/accounts/api_tokens.py), its user asked about once."""
        known = self.context.setdefault("_through_provider", {})
        if token.user_id not in known:
            known[token.user_id] = api_tokens.signs_in_through_provider(token.user)
        return api_tokens.expires_at_of(token, through_provider=known[token.user_id])

    def to_representation(self, instance: ApiToken) -> Any:
        data = super().to_representation(instance)
        if "expires_at" in data:
            data["expires_at"] = self.fields["expires_at"].to_representation(self.expires_at_of(instance))
        return data

    def validate_expires_in_days(self, days: int) -> int:
        most = api_tokens.max_days_for(self.context["request"].user)
        if days > most:  # beyond max_value: a user the identity provider signs in
            raise serializers.ValidationError(
                f"At most {most} days for an account that signs in through single sign-on."
            )
        return days

    def validate_workspace(self, workspace: Workspace | None) -> Workspace | None:
        user = self.context["request"].user
        if workspace is not None and not restrict(Workspace.objects.filter(pk=workspace.pk), user).exists():
            raise serializers.ValidationError(f"Object with name={workspace.name} does not exist.")
        return workspace


class ApiTokenViewSet(PortalViewSet):
    """Your personal API tokens: create (the token is in the answer, and only there), list and
    revoke (DELETE: it is refused at once, and stays listed as revoked). Tokens are managed from a
    signed-in session or with a read-write token for all of your workspaces, never with a token
    limited to one workspace or a workload's."""

    serializer_class = ApiTokenSerializer
    queryset = ApiToken.objects.none()  # for the schema; get_queryset() is the truth
    http_method_names = ["get", "post", "delete", "head", "options"]
    filterset_fields = ["scope", "key_id"]
    ordering_fields = ["created_at", "expires_at", "last_used_at"]

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):
            return self.queryset
        return ApiToken.objects.filter(user=self.request.user).select_related("workspace", "endpoint")

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        if isinstance(request.user, WorkloadUser):
            raise PermissionDenied("Tokens limited to one workspace cannot manage tokens; sign in to do this.")

    @extend_schema(responses=inline_serializer("NewToken", {"token": serializers.CharField()}))
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        token, text = api_tokens.do_create_token(
            request.user,
            name=data["name"],
            expires_in_days=data.get("expires_in_days", api_tokens.default_days_for(request.user)),
            scope=data.get("scope", ApiToken.Scope.WRITE),
            workspace=data.get("workspace"),
            limited=True,
            **self.action_kwargs(),
        )
        return Response({**self.get_serializer(token).data, "token": text}, status=201)

    def perform_destroy(self, instance: ApiToken) -> None:
        api_tokens.do_revoke_token(instance, reason="revoked by its user", **self.action_kwargs())


class DeviceLoginView(APIView):
    """Start a sign-in of the CLI through the browser (`gpuportal login` on a portal with single
    sign-on, or anywhere): a secret device code for the CLI, and a user code for the person to allow
    on the page at `verification_uri`, signed in there. Then ask `auth/device/token/`."""

    permission_classes = [AllowAny]
    authentication_classes: list[Any] = []
    PER_ADDRESS = 20  # logins waiting at once from one address

    class Start(StrictSerializer):
        name = serializers.RegexField(_NAME, max_length=100, required=False, help_text="what to call the token")

    @extend_schema(
        request=Start,
        responses={
            201: inline_serializer(
                "DeviceLogin",
                {
                    "device_code": serializers.CharField(),
                    "user_code": serializers.CharField(),
                    "verification_uri": serializers.URLField(),
                    "verification_uri_complete": serializers.URLField(),
                    "expires_in": serializers.IntegerField(),
                    "interval": serializers.IntegerField(),
                },
            )
        },
    )
    def post(self, request: Request) -> Response:
        body = self.Start(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        address = addresses.client_address(request._request)
        waiting = DeviceLogin.objects.filter(address=address, expires_at__gt=timezone.now(), decided_at__isnull=True)
        # Counted per client, as failed sign-ins are: never on a proxy's own, shared address.
        if addresses.distinct_client_address(request._request) and waiting.count() >= self.PER_ADDRESS:
            raise TooMany(
                "Too many sign-ins waiting from this address; try again later.", retry_after=device_login.TTL_S
            )
        device_code, row = device_login.start(body.validated_data.get("name") or "gpuportal login", address=address)
        page = request.build_absolute_uri(reverse("web:cli-login"))
        answer = {
            "device_code": device_code,
            "user_code": row.user_code,
            "verification_uri": page,
            "verification_uri_complete": f"{page}?code={row.user_code}",
            "expires_in": device_login.TTL_S,
            "interval": device_login.INTERVAL_S,
        }
        return Response(answer, status=201)


class DeviceTokenView(APIView):
    """Collect the token of a sign-in started at `auth/device/`, once it is allowed in the browser:
    400 with code `authorization_pending` until then, `access_denied` if refused, `expired_token`
    past its time, `invalid_grant` for an unknown or already collected one."""

    permission_classes = [AllowAny]
    authentication_classes: list[Any] = []

    class Collect(StrictSerializer):
        device_code = serializers.RegexField(r"^[A-Za-z0-9_-]+$", max_length=100)

    @extend_schema(request=Collect, responses=inline_serializer("DeviceToken", {"token": serializers.CharField()}))
    def post(self, request: Request) -> Response:
        body = self.Collect(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        origin = Origin.from_request(request._request)
        text = device_login.collect(body.validated_data["device_code"], origin=origin)  # or a LoginError
        return Response({"token": text})
