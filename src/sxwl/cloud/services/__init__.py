"""Business logic of the cloud; routers call these, these touch the models."""
