"""The layers: each layer's arguments, weights and forward pass (the lowest sub-tier of models/)."""
