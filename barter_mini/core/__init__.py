"""The method itself: model configurations (Table 4), budgets (Table 3), compact CCT/ViT on
timm modules, unit statistics, surgery with optimizer-state remapping, BARTER's topology
update (Figure 2), the method protocol, and a model's parameter and FLOP counts.

Imports no other layer of the package."""
