from __future__ import annotations

from typing import Any

from django.contrib.auth import authenticate, get_user_model, password_validation
from django.contrib.auth.models import Group, update_last_login
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import AnonRateThrottle
from rest_framework.views import APIView

from apps.accounts import actions
from apps.api.strict import StrictModelSerializer, StrictSerializer
from apps.api.views import IsPlatformAdmin, PortalViewSet
from apps.workspaces.access import restrict
from apps.workspaces.actions import ensure_private_workspace
from apps.workspaces.models import Workspace

User = get_user_model()


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
    """Exchange a username and password for an API token (for the CLI and SDK)."""

    permission_classes = [AllowAny]
    authentication_classes: list[Any] = []
    throttle_classes = [AnonRateThrottle]

    class Credentials(StrictSerializer):
        username = serializers.CharField(max_length=150)
        password = serializers.CharField(max_length=128, style={"input_type": "password"})

    @extend_schema(request=Credentials, responses=inline_serializer("Token", {"token": serializers.CharField()}))
    def post(self, request: Request) -> Response:
        credentials = self.Credentials(data=request.data)
        credentials.is_valid(raise_exception=True)
        user = authenticate(request._request, **credentials.validated_data)
        if user is None:
            raise AuthenticationFailed("Wrong username or password.")
        ensure_private_workspace(user)
        update_last_login(None, user)  # an account used only through the API has been used too
        token, _ = Token.objects.get_or_create(user=user)
        return Response({"token": token.key})
