"""The incidents app's HTTP API (serializers, views, urls)."""
