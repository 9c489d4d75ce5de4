"""The sxwl cloud: accounts, CPods, jobs and the web console."""
