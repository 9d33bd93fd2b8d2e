"""The providers: transport, clients with their retries, routing."""
