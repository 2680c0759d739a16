/* The conformance suite: shared state, helpers and the list of tests.
 *
 * The suite is written once against the public API (cubert/cubert.h) and
 * run once per backend: `conformance cpu`, `conformance cuda`,
 * `conformance null`. A test that needs a feature the backend does not
 * report is skipped there (CONF_TEST_NEEDS, below). Every test is
 * named after what it proves; the ones about reads, syncs, checks, flushes,
 * launches and Skip follow the sentences of the server contract
 * (reference/server-trait.txt) one by one.
 *
 * Every test runs between conf_test_setup and conf_test_teardown (main.c):
 * the teardown proves that the client is still usable, that the sentinel
 * buffer's bytes did not change (bad input touches no other buffer) and that
 * the test released every buffer it made. */
#ifndef CUBE_CONFORMANCE_H
#define CUBE_CONFORMANCE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <cubert/cubert.h>

/* --- shared state (main.c) --- */

#define CONF_SENTINEL_BYTES 4096u

/* Kernels, made once in the group setup and launched by many tests: each
 * client compiles a kernel once and caches it. */
typedef struct conf_kernels {
    cube_kernel *scale_add;      /* y = a * x + y (IN, INOUT, f32), dim 64 */
    cube_kernel *scale;          /* y = a * x (IN, OUT, f32), dim 64 */
    cube_kernel *fill;           /* y[i] = v + i (OUT u32, u32), dim 32 */
    cube_kernel *pos2d;          /* positions, dim (8, 4, 1) */
    cube_kernel *pos3d;          /* positions, dim (4, 2, 3) */
    cube_kernel *scalars;        /* echoes scalars of 1..8 bytes */
    cube_kernel *reverse[4];     /* reverse within a cube: dims 1,4,256,1024 */
    cube_kernel *reduce[3];      /* tree sum per cube: dims 4,256,1024 */
    cube_kernel *atomic_int;     /* u32 / i32 atomics */
    cube_kernel *atomic_f32;     /* f32 atomic add */
    cube_kernel *write_count;    /* writes a cube count (n, 1, 1) */
    cube_kernel *count_probe;    /* y[i] = CUBE_COUNT_X * 1000 + CUBE_POS_X */
    cube_kernel *oob_write;      /* CUBE_AT(y, i) = v for every unit */
    cube_kernel *oob_read;       /* y[i] = CUBE_AT(x, i + off) */
    cube_kernel *math;           /* math functions and a device helper */
    cube_kernel *two_entries;    /* second entry of a two-kernel source */
    cube_kernel *broken;         /* does not compile (IN, OUT, OUT) */
    cube_kernel *missing_entry;  /* its name is not in its source */
    cube_kernel *mark;           /* OUT u8, cube dim over the limit */
    cube_kernel *too_many_units; /* (IN, OUT), units over the limit */
    cube_kernel *dim_z_over;     /* (IN, OUT), cube_dim z over the limit */
    cube_kernel *shared_over;    /* shared memory one byte over the limit */
    cube_kernel *shared_at;      /* shared memory exactly at the limit */
    cube_kernel *skip_probe;     /* launched only by the Skip test */
    cube_kernel *rewrite;        /* x = 3x + 1, iters times (INOUT u32) */
    cube_kernel *spin;           /* y = f(x), long and late-reading (u32) */
    cube_kernel *trap;           /* calls cube_trap() (INOUT u32), dim 32 */
} conf_kernels;

typedef struct conf_state {
    const char *backend; /* argv[1] */
    cube_client *client;
    cube_properties props;
    cube_handle sentinel;
    unsigned char sentinel_bytes[CONF_SENTINEL_BYTES];
    uint64_t buffers_at_setup; /* live buffers when the test began */
    int finished;              /* the test body returned (did not fail) */
    conf_kernels k;
} conf_state;

extern conf_state conf;

/* --- helpers (util.c) --- */

/* Fails the test (printing the whole error) unless err is NULL. */
void conf_ok_at(cube_error *err, const char *expr, const char *file, int line);
/* Fails unless err has `code` (and, when `needle` is not NULL, a message
 * containing it); frees err. */
void conf_expect_at(cube_error *err, cube_code code, const char *needle,
                    const char *expr, const char *file, int line);
/* Like conf_expect_at but keeps err for further checks. */
void conf_code_at(const cube_error *err, cube_code code, const char *expr,
                  const char *file, int line);

#define CONF_OK(expr) conf_ok_at((expr), #expr, __FILE__, __LINE__)
#define CONF_EXPECT(expr, code)                                                \
    conf_expect_at((expr), (code), NULL, #expr, __FILE__, __LINE__)
#define CONF_EXPECT_MSG(expr, code, needle)                                    \
    conf_expect_at((expr), (code), (needle), #expr, __FILE__, __LINE__)
#define CONF_CODE(err, code)                                                   \
    conf_code_at((err), (code), #err, __FILE__, __LINE__)

/* Like conf_expect_at, but a message that does not name `needle` only
 * counts in *misses (so one test can report every such message). */
void conf_expect_named_at(cube_error *err, cube_code code, const char *needle,
                          int *misses, const char *expr, const char *file,
                          int line);
#define CONF_EXPECT_NAMED(expr, code, needle, misses)                          \
    conf_expect_named_at((expr), (code), (needle), (misses), #expr, __FILE__,  \
                         __LINE__)

/* Whether err or any cause below it (at any depth) has `code`. */
int conf_error_has_code(const cube_error *err, cube_code code);

/* Buffers on conf.client; each asserts success. */
cube_handle conf_create(const void *bytes, uint64_t size);
cube_handle conf_empty(uint64_t size);
cube_handle conf_slice(cube_handle h, uint64_t offset, uint64_t size);
void conf_release(cube_handle h);
/* Contiguous whole-range transfers; return the library's answer. */
cube_error *conf_read(cube_handle h, void *dst, uint64_t size);
cube_error *conf_write(cube_handle h, const void *src, uint64_t size);
#define CONF_READ_OK(h, dst, size) CONF_OK(conf_read((h), (dst), (size)))
#define CONF_WRITE_OK(h, src, size) CONF_OK(conf_write((h), (src), (size)))

cube_error *conf_launch(cube_kernel *k, cube_count count, const cube_arg *args,
                        size_t nargs, uint32_t mode);
/* Makes `h`'s allocation carry a launch failure: a launch that would have
 * written it fails, with conf_mark_code(). */
void conf_mark_failed(cube_handle h);
/* The code of the failure conf_mark_failed leaves: CUBE_ERR_RESOURCE_LIMIT
 * where kernels run (the launch is over the cube dimension limit),
 * CUBE_ERR_UNSUPPORTED on a backend without CUBE_FEATURE_KERNELS (the
 * launch fails at compile). Either way the failure store holds it. */
cube_code conf_mark_code(void);
/* Asserts that reading h is refused with SEVERAL whose causes include
 * `cause` somewhere, and that the destination was not touched. */
void conf_expect_refused_at(cube_handle h, uint64_t size, cube_code cause,
                            const char *file, int line);
#define CONF_EXPECT_REFUSED(h, size, cause)                                    \
    conf_expect_refused_at((h), (size), (cause), __FILE__, __LINE__)

cube_kernel *conf_kernel(const char *name, const char *source, uint32_t dx,
                         uint32_t dy, uint32_t dz);
/* Whether the backend compiles and runs kernels (CUBE_FEATURE_KERNELS). */
int conf_runs_kernels(void);
uint32_t conf_div_up(uint64_t n, uint32_t d);

/* The code of err (CUBE_OK for NULL; CUBE_ERR_INTERNAL for an error
 * without a message: an error must say what went wrong), freeing err. For
 * calls inside a capture window, whose results are asserted after the
 * window closes (an assertion failing mid-capture would leave the stream
 * capturing for the tests after it). */
cube_code conf_code(cube_error *err);
/* Fails (after printing every mismatch, named by what[i]) unless
 * got[i] == want[i] for each of the n calls of one step. */
void conf_expect_codes_at(const cube_code *got, const cube_code *want,
                          const char *const *what, size_t n, const char *file,
                          int line);
#define CONF_EXPECT_CODES(got, want, what, n)                                  \
    conf_expect_codes_at((got), (want), (what), (n), __FILE__, __LINE__)

/* Host models of main.c's u32 kernels: out = x0 after `steps` in-place
 * rewrites (x = 3x + 1; out may be x0), and y = spin(x, iters). */
void conf_rewritten(const uint32_t *x0, uint32_t *out, uint32_t n,
                    uint64_t steps);
void conf_spin_model(const uint32_t *x, uint32_t *y, uint32_t n,
                     uint32_t iters);
/* n uint32_t of host memory (the caller frees it); asserts on failure. */
uint32_t *conf_host_u32(uint32_t n);

/* Fills `n` bytes with a pattern that depends on `seed`. */
void conf_pattern(void *dst, size_t n, uint32_t seed);

/* --- the tests --- */

/* clang-format off */
#define CONF_TESTS(X)                                                          \
    /* clients (test_client.c) */                                              \
    X(client_open_named_backend_and_cpu_succeed)                               \
    X(client_open_null_device_uses_default)                                    \
    X(client_open_malformed_device_is_invalid_argument)                        \
    X(client_open_unknown_backend_or_index_is_not_found)                       \
    X(client_open_bad_index_of_the_backend_under_test_is_refused)              \
    X(client_open_bad_options_struct_size_is_invalid_argument)                 \
    X(client_open_with_options_works)                                          \
    X(client_open_cpu_threads_out_of_range_is_invalid_argument)                \
    X(client_close_frees_what_the_caller_did_not_release)                      \
    X(client_close_completes_outstanding_futures)                              \
    X(client_close_while_another_thread_waits_on_a_future)                     \
    X(client_properties_are_sane)                                              \
    X(client_backend_names_lists_cpu_and_is_terminated)                        \
    X(error_accessors_tolerate_null_and_format_whole_error)                    \
    X(error_code_names_are_distinct_and_non_empty)                             \
    X(log_level_parse_and_sink_receive_messages)                               \
    /* buffers (test_buffers.c) */                                             \
    X(buffer_create_read_round_trip_many_sizes)                                \
    X(buffer_empty_write_read_round_trip)                                      \
    X(buffer_handle_size_reports_the_range)                                    \
    X(buffer_label_set_read_clear_and_refuse)                                  \
    X(buffer_slice_write_changes_only_its_range)                               \
    X(buffer_slice_read_returns_its_range)                                     \
    X(buffer_slice_of_slice_composes_offsets)                                  \
    X(buffer_slice_out_of_range_is_invalid_argument)                           \
    X(buffer_slice_keeps_buffer_alive_after_parent_release)                    \
    X(buffer_retained_twice_needs_three_releases)                              \
    X(buffer_released_handle_is_not_found_everywhere)                          \
    X(buffer_handle_of_another_client_is_not_found)                            \
    X(buffer_handle_stays_foreign_to_thousands_of_later_clients)               \
    X(buffer_zero_handle_is_not_found)                                         \
    X(buffer_size_zero_is_invalid_argument)                                    \
    X(buffer_size_near_uint64_max_is_buffer_too_big)                           \
    X(buffer_whole_read_and_write_check_their_arguments)                       \
    X(api_null_pointers_are_invalid_argument_naming_the_argument)              \
    /* copy descriptors, async reads, staging (test_copy.c) */                 \
    X(copy_rank2_column_read_matches_reference)                                \
    X(copy_rank2_column_write_changes_only_the_column)                         \
    X(copy_rank2_subblock_read_matches_reference)                              \
    X(copy_rank2_subblock_write_changes_only_the_block)                        \
    X(copy_transposing_strides_read_matches_reference)                         \
    X(copy_zero_strides_mean_contiguous_row_major)                             \
    X(copy_rank8_and_wide_elements_round_trip)                                 \
    X(copy_batch_read_and_write_of_several_descriptors)                        \
    X(copy_descriptor_past_end_is_invalid_and_changes_nothing)                 \
    X(copy_host_size_mismatch_is_invalid_and_changes_nothing)                  \
    X(copy_rank_0_and_9_are_invalid_argument)                                  \
    X(copy_elem_size_0_and_65_are_invalid_argument)                            \
    X(copy_zero_extent_and_zero_stride_are_invalid_argument)                   \
    X(copy_overflowing_shape_is_invalid_argument)                              \
    X(copy_batch_with_one_bad_descriptor_writes_nothing)                       \
    X(read_async_wait_returns_data_and_future_becomes_ready)                   \
    X(read_async_waiting_twice_returns_null_the_second_time)                   \
    X(read_async_freeing_unwaited_future_is_safe)                              \
    X(read_async_argument_error_returns_no_future)                             \
    X(read_async_of_failed_buffer_reports_at_wait_untouched)                   \
    X(read_async_observes_stream_order)                                        \
    X(staging_buffers_feed_create_and_write)                                   \
    X(staging_free_of_foreign_pointer_is_not_found)                            \
    X(staging_zero_sizes_and_counts_are_invalid_argument)                      \
    /* kernels (test_kernels.c) */                                             \
    X(kernel_scale_add_elementwise_for_uneven_sizes)                           \
    X(kernel_launches_on_one_stream_run_in_order)                              \
    X(kernel_on_slices_writes_only_the_slice)                                  \
    X(kernel_slice_misaligned_for_its_elements_is_refused)                     \
    X(kernel_2d_positions_match_reference)                                     \
    X(kernel_3d_positions_match_reference)                                     \
    X(kernel_scalars_of_every_size_arrive_intact)                              \
    X(kernel_shared_memory_reverse_with_cube_dims_1_4_256_1024)                \
    X(kernel_shared_memory_tree_reduction_with_cube_sync)                      \
    X(kernel_atomic_u32_and_i32_adds_are_exact)                                \
    X(kernel_atomic_f32_add_is_exact)                                          \
    X(kernel_dynamic_count_sees_count_written_by_previous_kernel)              \
    X(kernel_dynamic_count_buffer_under_12_bytes_is_invalid)                   \
    X(kernel_zero_count_static_is_refused_dynamic_runs_nothing)                \
    X(kernel_dynamic_zero_count_keeps_output_failures)                         \
    X(kernel_checked_write_past_end_leaves_neighbours_intact)                  \
    X(kernel_checked_read_past_end_gives_zero)                                 \
    X(validate_write_past_end_reports_kernel_buffer_index_length)              \
    X(validate_read_past_end_reports_input_and_fails_outputs)                  \
    X(validate_counts_every_out_of_range_access)                               \
    X(validate_in_range_launch_succeeds_and_clears_output_failure)             \
    X(validate_kernel_with_cube_sync_reports_and_computes)                     \
    X(validate_launch_is_refused_while_capturing)                              \
    X(kernel_math_functions_and_device_helpers)                                \
    X(kernel_source_with_two_entries_runs_the_named_one)                       \
    X(kernel_object_is_usable_on_two_clients)                                  \
    X(kernel_create_rejects_bad_descriptors)                                   \
    X(kernel_id_is_stable_and_distinguishes_kernels)                           \
    X(kernel_retain_release_keeps_kernel_alive)                                \
    /* raw kernels: backend source and binaries (test_raw_kernels.c) */       \
    X(raw_create_rejects_hostile_descriptors_and_keeps_nothing)               \
    X(raw_id_covers_format_code_params_cube_dim_and_options)                  \
    X(raw_kernel_of_another_backend_fails_on_its_declared_outputs)            \
    X(raw_c_source_saxpy_over_many_cubes_with_4_and_8_byte_scalars)           \
    X(raw_c_source_2d_cube_count_reaches_every_cube_with_its_abi)             \
    X(raw_shared_object_built_by_cc_runs_like_the_source)                     \
    X(raw_shared_object_refused_or_missing_entry_is_compile_error)            \
    X(raw_c_source_compile_error_has_the_log_and_fails_declared_outputs)      \
    X(raw_launch_arguments_are_checked_against_the_declaration)               \
    X(raw_untrusted_input_fails_the_launch_and_its_outputs)                   \
    X(raw_kernel_in_a_graph_replays_with_rewritten_input)                     \
    X(raw_kernel_in_a_profile_window_and_skip_mode)                           \
    X(raw_cuda_source_saxpy_and_compile_error)                                \
    X(raw_cuda_declared_parameters_must_match_the_entry)                      \
    X(raw_cuda_ptx_binary_runs_and_bad_binary_is_compile_error)               \
    /* launch failures and the failure store (test_failures.c) */             \
    X(launch_compile_error_returns_compile_with_compiler_log)                  \
    X(launch_compile_error_is_recorded_on_bound_buffers)                       \
    X(read_of_buffer_whose_writer_failed_returns_several)                      \
    X(read_refusal_leaves_every_destination_untouched)                         \
    X(read_several_has_one_cause_per_failed_buffer)                            \
    X(read_refuses_failed_buffer_whichever_stream_ran_the_launch)              \
    X(read_of_slice_of_failed_buffer_is_refused)                               \
    X(check_answers_launch_failure_instantly)                                  \
    X(check_of_trusted_buffers_or_no_handles_is_null)                          \
    X(sync_drains_then_reports_failed_buffers)                                 \
    X(sync_with_no_handles_is_the_plain_barrier)                               \
    X(check_and_sync_refuse_released_handles)                                  \
    X(flush_does_not_report_launch_failure)                                    \
    X(full_write_clears_failure)                                               \
    X(partial_write_keeps_failure)                                             \
    X(failed_input_carries_forward_to_outputs)                                 \
    X(failed_inout_buffer_refuses_launch)                                      \
    X(failed_dynamic_count_buffer_carries_forward)                             \
    X(successful_launch_clears_output_failure)                                 \
    X(launch_over_unit_limit_is_resource_limit_on_outputs)                     \
    X(launch_over_cube_dim_limit_is_resource_limit)                            \
    X(launch_over_shared_memory_limit_is_resource_limit)                       \
    X(launch_at_shared_memory_limit_runs)                                      \
    X(launch_cube_count_over_limit_is_resource_limit)                          \
    X(launch_argument_count_mismatch_is_invalid_and_marks_outputs)             \
    X(launch_scalar_for_buffer_is_invalid_and_marks_outputs)                   \
    X(launch_buffer_for_scalar_is_invalid_and_marks_outputs)                   \
    X(launch_wrong_scalar_size_is_invalid_and_marks_outputs)                   \
    X(launch_argument_mismatch_marks_no_buffer_the_kernel_reads)               \
    X(launch_zero_static_count_is_invalid_and_records_nothing)                 \
    X(launch_unknown_mode_bits_are_invalid_and_record_nothing)                 \
    X(launch_null_kernel_args_and_bad_arg_kind_are_invalid)                    \
    X(launch_released_or_foreign_handle_is_not_found_records_nothing)          \
    X(launch_kernel_name_not_in_source_is_compile_error)                       \
    X(skip_launch_leaves_buffers_unchanged)                                    \
    X(skip_launch_still_reports_compile_error)                                 \
    X(skip_launch_still_validates_limits_and_arguments)                        \
    X(skip_then_execute_runs_the_kernel)                                       \
    /* threads, streams, memory (test_threads.c) */                            \
    X(threads_four_share_one_client_for_200_rounds)                            \
    X(stream_ids_lists_every_stream_used)                                      \
    X(stream_use_switches_and_restores_the_stream)                             \
    X(stream_use_choices_on_closed_clients_are_given_back)                     \
    X(stream_work_written_on_one_stream_is_read_on_another)                    \
    X(memory_usage_grows_and_shrinks_with_buffers)                             \
    X(memory_cleanup_keeps_live_buffers_readable)                              \
    /* graphs (test_graphs.c) */                                               \
    X(graph_capture_records_launches_without_running_them)                     \
    X(graph_replays_equal_the_same_launches_made_directly)                     \
    X(graph_replay_uses_inputs_rewritten_between_replays)                      \
    X(graph_replay_reads_dynamic_count_from_its_buffer)                        \
    X(graph_replay_of_dynamic_zero_count_keeps_output_failures)                \
    X(graph_end_returns_distinct_nonzero_ids_and_unprepares_the_stream)        \
    X(graph_prepare_twice_is_harmless_and_refused_while_capturing)             \
    X(graph_begin_without_prepare_is_graph_state)                              \
    X(graph_begin_while_capturing_is_graph_state_and_capture_continues)        \
    X(graph_end_without_begin_is_graph_state)                                  \
    X(graph_refused_end_leaves_the_stream_prepared)                            \
    X(graph_replay_of_unknown_or_destroyed_id_is_not_found)                    \
    X(graph_replay_from_capturing_stream_is_graph_state)                       \
    X(graph_capture_is_per_stream_other_streams_run_and_replay)                \
    X(graph_capture_refuses_read_write_sync_and_profile_then_continues)        \
    X(graph_capture_refusal_comes_before_the_failure_store)                    \
    X(graph_capture_allows_check_and_allocation)                               \
    X(graph_pins_buffer_allocated_in_window_until_destroy)                     \
    X(graph_keeps_recorded_buffers_alive_after_their_handles_go)               \
    X(graph_prepare_and_warm_up_leave_the_capture_nothing_to_allocate)         \
    X(graph_launch_failing_validation_in_window_is_returned_not_recorded)      \
    X(graph_destroy_of_unknown_or_destroyed_id_is_not_found)                   \
    X(graph_destroy_right_after_replay_leaves_its_results_intact)              \
    X(graph_failed_input_fails_replay_and_outputs_until_a_replay_lands)        \
    X(graph_recorded_launch_changes_no_failure_state_until_replay)             \
    X(graph_buffer_written_before_read_is_not_a_replay_input)                  \
    X(graph_buffer_read_before_written_stays_a_replay_input)                   \
    X(graph_left_undestroyed_is_freed_by_client_close)                         \
    X(graph_two_threads_capture_and_replay_their_own_graphs_at_once)           \
    X(graph_replayed_from_several_threads_at_once)                             \
    X(graph_destroyed_while_other_threads_replay_it_is_safe)                   \
    X(graph_replay_inside_dry_run_does_nothing)                                \
    X(graph_null_client_or_out_is_invalid_argument)                            \
    /* profiling windows and dry runs (test_profile.c) */                      \
    X(profile_window_reports_duration_method_and_launch_count)                 \
    X(profile_windows_nest)                                                    \
    X(profile_windows_overlap)                                                 \
    X(profile_end_twice_is_profile_error)                                      \
    X(profile_end_of_unknown_token_is_profile_error)                           \
    X(profile_abandon_drops_the_window)                                        \
    X(profile_failed_launch_in_window_fails_end_with_its_cause)                \
    X(profile_failure_outside_the_window_does_not_fail_it)                     \
    X(profile_failed_replay_in_window_fails_end)                               \
    X(profile_refused_calls_do_not_fail_the_window)                            \
    X(profile_window_counts_replayed_launches)                                 \
    X(profile_token_of_another_threads_stream_is_profile_error)                \
    X(profile_window_measures_what_its_timing_method_says)                     \
    X(profile_null_arguments_are_invalid_argument)                             \
    X(profile_windows_around_copies_and_a_failed_launch)                       \
    X(dry_run_launch_changes_no_buffer_or_failure_record)                      \
    X(dry_run_launches_compile_and_validate_but_change_no_buffer)              \
    X(dry_run_scopes_nest_and_launches_run_after_the_last_end)                 \
    X(dry_run_end_without_begin_is_refused)                                    \
    X(dry_run_scope_covers_only_the_thread_and_client_that_opened_it)                        \
    /* memory pools, layouts, reports, modes (test_memory.c) */                \
    X(memory_preset_layouts_validate_and_install_on_an_empty_stream)           \
    X(memory_validation_rejects_each_mistake_naming_pool_and_field)            \
    X(memory_install_with_live_buffers_is_pools_in_use_keeping_old_layout)     \
    X(memory_install_refused_for_live_buffers_applies_to_later_streams)        \
    X(memory_install_retried_after_release_rebuilds_the_calling_stream)        \
    X(memory_install_leaves_other_existing_streams_alone)                      \
    X(memory_install_before_a_streams_first_allocation_stays_its_layout)       \
    X(memory_install_of_a_bad_layout_changes_nothing)                          \
    X(memory_install_is_unsupported_only_without_configurable_pools)           \
    X(memory_calls_on_a_stream_named_for_the_first_time_succeed)               \
    X(memory_report_lists_pools_in_routing_order_then_tail_then_persistent)    \
    X(memory_usage_and_report_are_per_stream)                                  \
    X(memory_report_usage_equals_usage_get_and_pools_sum_to_it)                \
    X(memory_high_water_marks_rise_stay_after_release_and_reset_to_now)        \
    X(memory_largest_buffer_is_the_largest_request_each_pool_served)           \
    X(memory_buffer_above_every_pool_goes_to_the_tail_at_about_its_size)       \
    X(memory_half_of_device_memory_is_never_buffer_too_big)                    \
    X(memory_buffer_above_device_memory_is_buffer_too_big)                     \
    X(memory_padding_is_what_alignment_adds_to_live_buffers)                   \
    X(memory_buffer_released_on_another_stream_returns_to_its_own_pools)       \
    X(memory_sliced_pool_merges_neighbouring_free_slices)                      \
    X(memory_exclusive_pages_unused_for_release_after_ms_are_given_back)       \
    X(memory_full_capped_pool_spills_over_to_the_next_pool)                    \
    X(memory_every_able_pool_at_its_cap_is_pool_capacity_exceeded)             \
    X(memory_cleanup_releases_what_nothing_uses_and_never_a_live_buffer)       \
    X(memory_expandable_pool_maps_what_buffers_use_and_cleanup_unmaps_the_rest) \
    X(memory_expandable_pool_keeps_a_live_graphs_buffers_mapped_through_cleanup) \
    X(memory_persistent_mode_routes_to_the_persistent_pool_auto_routes_back)   \
    X(memory_persistent_pool_reuses_a_released_buffer_of_the_same_size)        \
    X(memory_persistent_windows_nest_and_end_without_begin_is_invalid)         \
    X(memory_graph_prepare_allocates_persistently_until_graph_end)             \
    X(memory_report_format_table_names_every_pool_kind)                        \
    X(memory_report_format_json_parses_with_pools_and_usage)                   \
    X(memory_report_format_refuses_a_count_above_its_array)                    \
    X(memory_layout_strides_contiguous_and_pitched)                            \
    X(memory_layout_strides_bad_inputs_are_invalid_argument)                   \
    X(memory_null_arguments_are_invalid_argument_naming_the_argument)          \
    X(memory_dry_run_buffers_get_memory_at_first_real_use)                     \
    X(memory_dry_run_buffer_without_memory_passes_sync_and_check)              \
    X(memory_dry_run_buffer_that_cannot_be_backed_is_storage_mapping_failed) \
    X(memory_dry_run_buffer_that_cannot_be_backed_fails_its_launch_as_mapping) \
    X(memory_usage_device_counts_every_thread_s_stream)                        \
    X(memory_stats_count_a_known_sequence)                                     \
    /* the list of live buffers (test_snapshot.c) */                           \
    X(snapshot_lists_each_buffer_once_with_size_pool_and_label)                \
    X(snapshot_fills_at_most_cap_and_counts_all)                               \
    X(snapshot_marks_wrapped_and_dry_run_buffers)                              \
    X(snapshot_refuses_bad_input_and_the_client_still_answers)                 \
    /* stress: threads, streams, handoffs, failures (test_stress.c) */         \
    X(stress_mixed_operations_from_eight_threads_on_several_streams)           \
    X(stress_producer_consumer_across_streams_with_in_place_rewrites)          \
    X(stress_failures_cross_streams)                                           \
    /* graphs, timing, pitched copies, threads on a device (test_device.c) */  \
    X(device_graph_chain_of_three_kernels_replays_like_direct_launches)        \
    X(device_graph_misuse_is_graph_state_and_leaves_the_stream_usable)         \
    X(device_graph_capture_that_allocates_follows_the_backends_graph_kind)     \
    X(device_profile_window_times_real_work_and_inner_window_is_not_longer)    \
    X(device_pitched_copies_touch_exactly_their_rows_and_keep_the_padding)     \
    X(device_eight_threads_own_streams_200_rounds_share_one_input)             \
    /* ordering, reuse, failures, faults across streams (test_streams.c) */    \
    X(streams_consumer_waits_for_the_last_in_place_rewrite_on_another)         \
    X(streams_rewrite_waits_for_reads_issued_earlier_on_another_stream)        \
    X(streams_two_threads_hand_off_in_place_rewrites_round_by_round)           \
    X(streams_buffer_released_while_another_stream_reads_it_waits_for_it)      \
    X(streams_dynamic_count_written_on_another_stream_is_waited_for)           \
    X(streams_failure_on_one_stream_is_reported_on_others_until_rewritten)     \
    X(streams_copies_failures_and_releases_cross_streams)                      \
    X(streams_ids_list_each_stream_once_explicit_ids_are_separate_queues)      \
    X(streams_device_fault_breaks_every_call_until_the_client_is_reopened)    \
    /* communication between devices (test_comm.c) */                          \
    X(comm_all_reduce_every_dtype_and_op_matches_the_host)                     \
    X(comm_every_collective_with_a_thread_per_rank_matches_the_host)           \
    X(comm_in_place_layouts_work_and_other_overlaps_are_refused)               \
    X(comm_failed_source_refuses_on_every_rank_and_marks_destinations)         \
    X(comm_mismatched_calls_are_refused_everywhere_and_the_comm_goes_on)       \
    X(comm_missing_rank_and_unmatched_send_time_out_then_the_comm_goes_on)     \
    X(comm_one_rank_answers_alone_as_in_a_group)                              \
    X(comm_send_to_the_calling_rank_pairs_with_its_receive_in_a_group)      \
    X(comm_abort_wakes_a_waiting_rank_and_refuses_later_calls)                 \
    X(comm_hostile_arguments_get_clear_errors_and_change_nothing)              \
    X(comm_copy_peer_between_clients_devices_and_backends)                     \
    X(comm_kernel_on_another_stream_sees_the_reduced_buffer)                   \
    X(comm_graph_step_with_all_reduce_replays_like_the_host)                   \
    X(comm_graph_group_of_sends_and_receives_replays_as_a_group)              \
    X(comm_graph_ring_on_one_rank_replays_its_send_to_itself)              \
    X(comm_graph_group_driven_by_one_thread_replays_per_rank)                 \
    X(comm_graph_capture_on_one_rank_only_is_refused_on_every_rank)            \
    X(comm_graph_replay_without_the_peer_times_out_and_marks_outputs)          \
    X(comm_graph_mismatched_replays_are_refused_on_every_rank)                 \
    X(comm_graph_replay_after_the_comm_is_destroyed_is_refused)                \
    X(comm_graph_replay_after_an_abort_is_refused)                             \
    X(comm_ids_round_trip_and_bad_ids_and_ranks_are_refused)                   \
    X(comm_job_from_the_launchers_environment_in_order_hostile_refused)     \
    /* sharing memory and streams (test_interop.c) */                          \
    X(interop_native_buffer_and_stream)                                        \
    X(interop_wrapped_memory_is_shared_released_once_and_failable)             \
    X(interop_wrap_refuses_bad_memory_and_takes_nothing)                       \
    X(interop_native_written_orders_and_clears_failures)                       \
    X(interop_native_wait_orders_after_a_foreign_stream)                       \
    X(interop_dlpack_export_and_import_round_trip)                             \
    X(interop_dlpack_refuses_bad_tensors_and_keeps_them_the_callers)

/* clang-format on */

/* The device-fault scenario, run alone in a child process by
 * streams_device_fault_breaks_every_call_until_the_client_is_reopened
 * (test_streams.c) through `conformance BACKEND --device-fault`. */
void conf_device_fault_scenario(void **state);

#define CONF_DECLARE(name) void name(void **state);
CONF_TESTS(CONF_DECLARE)
#undef CONF_DECLARE

/* Skips the running test (cmocka reports it SKIPPED, not passed) unless
 * the backend reports every bit of `features` (CUBE_FEATURE_*) in
 * cube_properties.features; `names` spells them for the message. */
void conf_require(uint32_t features, const char *names);

/* What a backend does that no CUBE_FEATURE_* bit says (backends.c): each
 * behaviour has a name there, with the backends that have it and why. A
 * test asks these instead of comparing the backend's name, so a backend
 * with no entries (a copy of one under another name) follows only its
 * properties. An unknown name fails the test. */
/* The reason the backend under test has behaviour `what`, or NULL. */
/* The environment as the suite's process started (main.c), for the
 * processes it starts. */
char **conf_start_environ(void);

const char *conf_backend_note(const char *what);
/* Nonzero, after printing the reason, when the backend has `what`: the
 * caller then leaves out the rest of the test. */
int conf_backend_skips_rest(const char *what);
/* Skips the running test unless the backend has `what`; `needs` says in
 * words what the test needs, for the message. */
void conf_require_backend(const char *what, const char *needs);

/* Defines test `name`, which runs only on backends that report every bit
 * of `features` and is skipped on the others, with a body that takes no
 * arguments. The check comes before the body, so a skipped test made
 * nothing it would have to release. A test that launches a kernel (other
 * than through conf_mark_failed) needs CUBE_FEATURE_KERNELS:
 *
 *     CONF_TEST_NEEDS(kernel_..., CUBE_FEATURE_KERNELS) { ... }
 */
#define CONF_TEST_NEEDS(name, features)                                        \
    static void name##__body(void);                                            \
    void name(void **state)                                                    \
    {                                                                          \
        (void)state;                                                           \
        conf_require((features), #features);                                   \
        name##__body();                                                        \
        conf.finished = 1;                                                     \
    }                                                                          \
    static void name##__body(void)

/* Defines test `name`, which every backend runs. */
#define CONF_TEST(name) CONF_TEST_NEEDS(name, 0u)

#endif /* CUBE_CONFORMANCE_H */
