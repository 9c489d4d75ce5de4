"""The job pages: the form, the list and a job's live page."""
