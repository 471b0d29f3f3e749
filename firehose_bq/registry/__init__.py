"""Schema registries: Stencil descriptor sets behind a refreshing cache, and Confluent's protobuf registry."""
