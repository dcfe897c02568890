"""What the tests share: tiny models, references, the gloo pool, the job runner and its warm interpreter."""
