"""Pages only admins see: users, and the money settings (prices, fees, top-ups, payouts)."""
