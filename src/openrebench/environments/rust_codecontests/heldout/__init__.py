"""rust_codecontests' held-out problem families (masked in every sandbox, as reference/ is)."""
