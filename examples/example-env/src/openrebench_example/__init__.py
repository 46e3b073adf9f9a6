"""example_fit: a worked example of an openrebench environment shipped as its own package."""
