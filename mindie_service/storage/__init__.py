"""Durable stores of the online routes (the Responses API's), apart from the batch jobs' (mindie_service.jobs),
and the one way both open their SQLite file (sqlite_db)."""
