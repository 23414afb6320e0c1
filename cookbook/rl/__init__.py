"""The client's RL loop over environments: :mod:`.train` (the loop and its config), :mod:`.core`
(its parts), :mod:`.advantages` (advantages through the ADVANTAGE_FN registry) and :mod:`.stream` (streaming minibatches and off-by-K sampling). Nothing here registers a
component; import the module you use (``from cookbook.rl.train import RLTrainConfig, train``)."""
