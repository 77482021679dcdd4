"""The imported-SFT recipe: a trajectory dataset in the Orchard ``swe`` layout, imported and trained on.

``recipe.yaml`` runs ``orchard import`` of ``RUN_DIR/dataset.parquet`` with the trajectory assembler and an SFT
sample builder, then the policy trainer; ``sample_data`` writes a small synthetic dataset in that layout, so the
recipe can be tried without network access.
"""
