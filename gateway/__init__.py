"""The gateway: pipeline, routing, enforcement, operator commands and the CLI."""
