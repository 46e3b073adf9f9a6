"""The metered model gateway (placeholder: the gateway's own package file replaces this one)."""
