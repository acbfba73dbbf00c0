"""Developer tools: generators and scripts the product never imports."""
