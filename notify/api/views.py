"""The notify API: channels and rules (viewers read, admins change), a channel's test
send (admins), and the notifications sent (viewers)."""

from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.views import APIView

from common.params import choice_param, id_param
from notify import selectors, services
from notify.api import serializers as s
from notify.models import Channel, Notification, Rule

CHANGE = {"GET": "viewer", "POST": "admin", "PUT": "admin", "DELETE": "admin"}


class ChannelListView(generics.ListCreateAPIView):
    """Where notifications go: webhook, Slack, PagerDuty or e-mail."""

    required_roles = CHANGE
    serializer_class = s.ChannelSerializer
    parser_classes = [JSONParser]
    queryset = Channel.objects.order_by("name", "id")


class ChannelDetailView(generics.RetrieveUpdateDestroyAPIView):
    """A channel; PUT replaces it (a secret left out is kept)."""

    required_roles = CHANGE
    serializer_class = s.ChannelSerializer
    parser_classes = [JSONParser]
    queryset = Channel.objects.all()
    http_method_names = ["get", "put", "delete", "options"]


class ChannelTestView(APIView):
    required_role = "admin"

    @extend_schema(
        request=None,
        responses=s.TestSendSerializer,
        summary="Send a test message through the channel now; answers the attempt's outcome",
    )
    def post(self, request, pk):
        channel = Channel.objects.filter(pk=pk).first()
        if channel is None:
            raise Http404("No such channel.")
        delivery = services.channel_test_send(channel=channel)
        attempt = delivery.attempt
        return Response(
            s.TestSendSerializer(
                {
                    "notification": attempt.notification_id,
                    "outcome": "sent" if delivery.outcome == "sent" else "failed",
                    "attempt": attempt,
                }
            ).data
        )


class RuleListView(generics.ListCreateAPIView):
    """Which events go to which channel; empty filters let everything through."""

    required_roles = CHANGE
    serializer_class = s.RuleSerializer
    parser_classes = [JSONParser]
    queryset = Rule.objects.order_by("name", "id")


class RuleDetailView(generics.RetrieveUpdateDestroyAPIView):
    required_roles = CHANGE
    serializer_class = s.RuleSerializer
    parser_classes = [JSONParser]
    queryset = Rule.objects.all()
    http_method_names = ["get", "put", "delete", "options"]


class NotificationListView(generics.ListAPIView):
    """Notifications, newest first, each with its delivery attempts."""

    serializer_class = s.NotificationSerializer

    @extend_schema(
        parameters=[
            OpenApiParameter(
                "incident",
                {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
                description="only those about this incident",
            ),
            OpenApiParameter("state", str, enum=Notification.State.values),
        ]
    )
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        r = self.request
        return selectors.notification_list(
            incident=id_param(r, "incident"),
            state=choice_param(r, "state", Notification.State.values),
        )
