"""Models as graphs of layers: nodes, sequential and functional models, their weights."""
