"""The built-in environments, one folder each. The registry (`openrebench.runs.environment_classes`)
finds every sub-package here whose `__init__` names its class `ENVIRONMENT`: adding an environment is
adding a folder, with no list to edit."""
