"""Losses of the papers' objectives: the AUC and AP surrogates (:mod:`.auc`) and distributionally robust losses (:mod:`.dro`)."""
