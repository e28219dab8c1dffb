"""Supervised sequence models, one file each: the network and its config.

    tlob   TLOB (Berti and Kasneci 2025): dual attention over time and over features (tlob.py)
    cfc    Liquid / closed-form continuous-time network (Hasani et al. 2022) (cfc.py)
    mamba2 Mamba-2: state-space layers by the chunked SSD algorithm (Dao and Gu 2024) (mamba2.py)
    tft    Temporal Fusion Transformer: variable selection, LSTM, interpretable attention,
           quantile forecasts (Lim et al. 2021) (tft.py)

Each config extends `foxhunt.train.agents.supervised.SupervisedConfig` (windows, labels,
optimiser, schedule) with the network's own sizes and builds the network (`build`). One agent,
`SupervisedAgent`, trains any of them through the loop every agent shares
(foxhunt.train.core): windows of the resident fxcache gathered on the device, direction labels
with a threshold fitted on the train range, trading through the same env and metrics.
"""
