"""The account page: the user's accessKey, balance and storage."""
