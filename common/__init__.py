"""What every app shares and nothing domain: imports no app of the project."""
