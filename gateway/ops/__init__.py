"""Operating the gateway: the CLI, client onboarding, the doctor."""
