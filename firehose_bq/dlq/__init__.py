"""Dead-letter queues: where messages go that the policy does not write or fail on, and their replay."""
