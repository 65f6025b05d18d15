// Setup helper for scripts/rocketmq.sh, run in one short-lived JVM against the running server:
// waits until the broker has registered with the name server, creates the topics (4 queues) and
// the consumer groups (1 s retry backoff, pre-created %RETRY%<group> topic), then proves that a
// send works (the readiness probe). Compiled once per content into the jar cache.
// Prints one line per step ("broker ...", "topic T", "group G", "probe send ok", each with the
// milliseconds since start); rocketmq.sh relays them as progress.
import java.util.*;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.constant.PermName;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.remoting.protocol.body.ClusterInfo;
import org.apache.rocketmq.remoting.protocol.route.BrokerData;
import org.apache.rocketmq.remoting.protocol.subscription.CustomizedRetryPolicy;
import org.apache.rocketmq.remoting.protocol.subscription.GroupRetryPolicy;
import org.apache.rocketmq.remoting.protocol.subscription.GroupRetryPolicyType;
import org.apache.rocketmq.remoting.protocol.subscription.SubscriptionGroupConfig;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

public class RmqSetup {
    // args: namesrv deadlineEpochMs probeTopic retryMax "topics..." "groups..."
    public static void main(String[] a) throws Exception {
        String ns = a[0];
        long deadline = Long.parseLong(a[1]);
        String probeTopic = a[2];
        int retryMax = Integer.parseInt(a[3]);
        String[] topics = a[4].trim().isEmpty() ? new String[0] : a[4].trim().split("\\s+");
        String[] groups = a[5].trim().isEmpty() ? new String[0] : a[5].trim().split("\\s+");
        int rc = 1;
        final long t0 = System.currentTimeMillis();
        DefaultMQAdminExt admin = new DefaultMQAdminExt();
        admin.setNamesrvAddr(ns);
        admin.setInstanceName("rmq-setup-" + System.nanoTime());
        DefaultMQProducer producer = new DefaultMQProducer("rocketmq-dedup-probe");
        producer.setNamesrvAddr(ns);
        producer.setInstanceName("rmq-setup-probe-" + System.nanoTime());
        producer.setSendMsgTimeout(3000);
        producer.setRetryTimesWhenSendFailed(0);
        try {
            admin.start();
            String brokerAddr = null;
            Exception last = null;
            while (System.currentTimeMillis() < deadline) {
                try {
                    ClusterInfo ci = admin.examineBrokerClusterInfo();
                    for (BrokerData bd : ci.getBrokerAddrTable().values()) {
                        String addr = bd.getBrokerAddrs().get(0L);
                        if (addr != null) brokerAddr = addr;
                    }
                    if (brokerAddr != null) {
                        System.out.println("broker " + brokerAddr + " +" + (System.currentTimeMillis() - t0) + "ms");
                        break;
                    }
                } catch (Exception e) {
                    last = e;
                }
                Thread.sleep(200);
            }
            if (brokerAddr == null) {
                System.err.println("broker did not register with the name server in time: " + last);
                System.exit(1);
            }
            List<String> all = new ArrayList<>(Arrays.asList(topics));
            all.add(probeTopic);
            for (String t : all) {
                TopicConfig tc = new TopicConfig(t, 4, 4);
                admin.createAndUpdateTopicConfig(brokerAddr, tc);
                System.out.println("topic " + t + " +" + (System.currentTimeMillis() - t0) + "ms");
            }
            for (String g : groups) {
                SubscriptionGroupConfig sg = new SubscriptionGroupConfig();
                sg.setGroupName(g);
                sg.setRetryMaxTimes(retryMax);
                GroupRetryPolicy p = new GroupRetryPolicy();
                p.setType(GroupRetryPolicyType.CUSTOMIZED);
                long[] next = new long[18];
                Arrays.fill(next, 1000L);
                p.setCustomizedRetryPolicy(new CustomizedRetryPolicy(next));
                sg.setGroupRetryPolicy(p);
                admin.createAndUpdateSubscriptionGroupConfig(brokerAddr, sg);
                // pre-create the classic retry topic: a classic push consumer only learns the route
                // of %RETRY%<group> at start or on its periodic refresh, so a retry topic that
                // appears later delays the first redelivery by ~10 s instead of ~1 s
                admin.createAndUpdateTopicConfig(brokerAddr,
                    new TopicConfig("%RETRY%" + g, 1, 1, PermName.PERM_READ | PermName.PERM_WRITE));
                System.out.println("group " + g + " +" + (System.currentTimeMillis() - t0) + "ms");
            }
            producer.start();
            while (true) {
                try {
                    SendResult r = producer.send(new Message(probeTopic, "probe", "probe".getBytes()));
                    if (r.getSendStatus() == SendStatus.SEND_OK) {
                        System.out.println("probe send ok " + r.getMsgId() + " +" + (System.currentTimeMillis() - t0) + "ms");
                        rc = 0;
                        break;
                    }
                    last = new RuntimeException(String.valueOf(r.getSendStatus()));
                } catch (Exception e) {
                    last = e;
                }
                if (System.currentTimeMillis() >= deadline) {
                    System.err.println("probe send never succeeded: " + last);
                    break;
                }
                Thread.sleep(200);
            }
        } finally {
            try { producer.shutdown(); } catch (Exception ignored) { }
            try { admin.shutdown(); } catch (Exception ignored) { }
        }
        System.exit(rc);
    }
}
