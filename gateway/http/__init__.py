"""The HTTP side: the request pipeline, the endpoints, the application, its server and workers."""
