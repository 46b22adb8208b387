"""Access control: who is asking (principals from API keys, JWTs or local mode), what they may do (scopes),
what they own, where browser requests may come from, and the audit trail of it all."""
