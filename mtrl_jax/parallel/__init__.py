"""Mesh from config, logical-axis rules, sharded state and steps, multi-host start-up."""
from mtrl_jax.parallel.batch import (batch_axes, batch_sharding, check_batch_divisible, num_batch_shards,
                                     process_batch_rows, put_global_batch, shard_batch)
from mtrl_jax.parallel.distributed import DistributedConfig, ProcessInfo, initialize_from_config
from mtrl_jax.parallel.mesh import (AXIS_NAMES, MeshSetup, default_mesh_config, make_mesh, mesh_from_config,
                                    setup_from_config)
from mtrl_jax.parallel.rules import (DEFAULT_RULES, FSDP_RULES, LOGICAL_AXES, PRESETS, activation_rules,
                                     get_rules, logical_to_spec, rules_from_config, validate_rules)
from mtrl_jax.parallel.sharded_init import abstract_model, create_sharded, state_shardings
from mtrl_jax.parallel.sharded_step import (ShardedFn, fetch_replicated, init_opt_state, make_grad_fn,
                                            make_train_step, opt_state_shardings, replicated,
                                            sharding_context)
