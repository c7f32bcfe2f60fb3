"""Where the adapters run: the bubblewrap sandbox of untrusted code (`sandbox`), the LLB-OS machines
(`os_machines/`), the LLB-DB MySQL server (`mysql/`) and memrl's Docker images (`docker_images`)."""
