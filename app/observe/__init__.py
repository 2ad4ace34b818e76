"""What the server tells people about itself: Prometheus metrics and the dashboard's history."""
