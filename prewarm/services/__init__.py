"""Use cases, one home each, called by the apps (web/, scheduler/, the CLI): see DESIGN.md, Layers."""
