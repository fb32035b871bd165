"""The target model: loading real checkpoints and wrapped ones, its layers, the toy targets."""
