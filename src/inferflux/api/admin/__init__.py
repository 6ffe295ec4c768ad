"""Admin routes under `/v1/admin/` (the security layer requires the `admin` scope)."""
