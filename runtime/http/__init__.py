"""The HTTP server: the Flask app, its gunicorn worker, health, readiness and metrics endpoints."""
