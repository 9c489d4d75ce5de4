"""Sign-up, sign-in and sign-out pages."""
