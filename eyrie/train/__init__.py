"""Training the EAGLE-3 drafter: model, data, loss, optimiser, vocabulary, the loop."""
