"""Database: engine, sessions, models and migrations."""
