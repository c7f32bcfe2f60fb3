"""Where the adapters run: sandboxes, the MySQL server, Docker images and the offline local model."""
