"""spark.py's pure decisions, without a SparkSession."""


def test_tasks_per_batch_are_the_cores_the_driver_can_know_of_else_unlimited() -> None:
    from firehose_bq.spark import task_slots

    assert task_slots("local[2]", {}, 2) == 2
    assert task_slots("local[*]", {}, 8) == 8
    # A cluster whose executors have not registered yet: Spark's floor of 2 is no count of its cores.
    assert task_slots("spark://h:7077", {}, 2) == 0
    assert task_slots("yarn", {"spark.executor.instances": "10", "spark.executor.cores": "4"}, 2) == 40
    dynamic = {"spark.dynamicAllocation.enabled": "true", "spark.executor.cores": "2"}
    assert task_slots("k8s://h", {**dynamic, "spark.dynamicAllocation.maxExecutors": "50",
                                  "spark.executor.instances": "1"}, 2) == 100
    assert task_slots("k8s://h", dynamic, 2) == 0  # no maximum: unbounded
    assert task_slots("spark://h:7077", {"spark.cores.max": "12"}, 6) == 12
    assert task_slots("spark://h:7077", {}, 16) == 16  # registered already
    assert task_slots("yarn", {"spark.default.parallelism": "3"}, 3) == 3  # the user's own statement
    assert task_slots("yarn", {"spark.executor.cores": "x", "spark.executor.instances": "4"}, 2) == 0
