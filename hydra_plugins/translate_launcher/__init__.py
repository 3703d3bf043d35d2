# translate's launchers for Hydra (plugins must live in the hydra_plugins namespace package).
